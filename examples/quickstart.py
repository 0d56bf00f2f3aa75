"""Create an Environment, run commands, move files, delete it: the Python SDK's first five minutes.

Run against `adx up` (it saved the API URL and a key for you): `python examples/quickstart.py`.
"""

import adx

with adx.Client() as client:
    env = client.environments.create(cpu="500m", memory="256Mi")  # returns once it is running
    try:
        print("created", env.id)
        result = env.commands.run("echo hello from $(hostname)")
        print(result.stdout.strip(), "exit", result.exit_code)

        env.files.write("/work/notes.txt", "first line\n")
        env.commands.run("echo second line >> /work/notes.txt")
        print(env.files.read("/work/notes.txt").decode(), end="")

        failed = env.commands.run(["python3", "-c", "import sys; sys.exit(3)"])
        assert failed.exit_code == 3, failed
    finally:
        env.delete()
        print("deleted", env.id)
