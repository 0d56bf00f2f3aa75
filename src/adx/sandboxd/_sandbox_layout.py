"""What a sandbox's directory holds, by name, and the descriptors and paths its execd init is given.

Shared by sandboxd (which makes and reads the directory), the supervisor (which writes the identity, exit
record and logs there) and the registry. Imported by the spawner's template too: no pathlib here.
"""

from __future__ import annotations

__all__ = [
    "CLAIM_SOCKET",
    "CONTROL_DIR",
    "CONTROL_DIR_INSIDE",
    "CONTROL_SOCKET",
    "EXECD_ADMIN_SOCKET_FD",
    "EXECD_MOUNT",
    "EXECD_SOCKET_FD",
    "EXECD_SOCKET_NAMES",
    "EXIT_FILE",
    "LOCK_FILE",
    "NATIVE_FILE",
    "NATIVE_TEMP",
    "OUTPUT_LOG",
    "RECORD_FILE",
    "SOCKETS_DIR",
    "SUPERVISOR_LOG",
    "TOMBSTONE_FILE",
    "boot_id",
]

LOCK_FILE = "lifecycle.lock"
NATIVE_FILE = "native.json"
EXIT_FILE = "exit.json"
RECORD_FILE = "record.json"
TOMBSTONE_FILE = "tombstone.json"
NATIVE_TEMP = f".{NATIVE_FILE}.tmp"
SUPERVISOR_LOG = "supervisor.log"
OUTPUT_LOG = "output.log"
#: A warm pool member's: the claiming create sends its spec here and reads the start report back.
CLAIM_SOCKET = "claim.sock"

#: Where an execd sandbox finds execd's modules (sandboxd's execd runtime, read-only).
EXECD_MOUNT = "/opt/adx"
#: Host-only per-sandbox dirs (never mounted into the sandbox): execd's listening sockets; the hub's socket.
SOCKETS_DIR = "sockets"
CONTROL_DIR = "control"
CONTROL_SOCKET = "control.sock"


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


#: execd sandboxes: the listening client and admin sockets are PID 1's descriptors 3 and 4 (socket activation).
EXECD_SOCKET_FD = 3
EXECD_ADMIN_SOCKET_FD = 4
EXECD_SOCKET_NAMES = ("execd.sock", "execd-admin.sock")
#: execd sandboxes: sandboxd's per-sandbox control socket dir, mounted read-only here inside.
CONTROL_DIR_INSIDE = "/run/adx-control"
