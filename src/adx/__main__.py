from adx.cli import main

main()
