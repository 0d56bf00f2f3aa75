"""A program written for the `e2b` SDK, unchanged, running on ADX.

Point the SDK at ADX with three variables (docs/e2b.md), then run it:

    export E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 E2B_API_KEY=adxk_...
    python examples/e2b_unchanged.py
"""

from e2b import Sandbox

sandbox = Sandbox.create()
try:
    print(sandbox.commands.run("echo hello from e2b on adx").stdout, end="")
    sandbox.files.write("/work/data.csv", "a,b\n1,2\n")
    print([entry.name for entry in sandbox.files.list("/work")])
finally:
    sandbox.kill()
