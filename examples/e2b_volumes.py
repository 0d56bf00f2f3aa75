"""An `e2b` program using a volume, unchanged, on ADX: files that outlive the sandboxes that wrote them.

Point the SDK at ADX (docs/e2b.md), the volume content API at the same URL, then run it:

    export E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 E2B_API_KEY=adxk_...
    export E2B_VOLUME_API_URL=http://127.0.0.1:8080
    python examples/e2b_volumes.py
"""

import uuid

from e2b import Sandbox, Volume

volume = Volume.create(f"example-{uuid.uuid4().hex[:8]}")
try:
    volume.write_file("/input.txt", "hello from the volume API\n")
    first = Sandbox.create(volume_mounts={"/mnt/data": volume})
    try:
        first.commands.run("tr a-z A-Z < /mnt/data/input.txt > /mnt/data/output.txt")
    finally:
        first.kill()  # the files stay in the volume
    second = Sandbox.create(volume_mounts={"/data": volume.name})
    try:
        print("seen by a second sandbox:", second.commands.run("cat /data/output.txt").stdout, end="")
    finally:
        second.kill()
    print("read through the volume API:", volume.read_file("/output.txt"), end="")
finally:
    Volume.destroy(volume.volume_id)
