"""What ``/proc/self/cmdline`` and ``environ`` show, rewritten in place: for a process that becomes execd without
an exec of its argv (sandboxd's in-process PID 1, a warm member's pre-started interpreter: ``_prestart``).

Standard library only (execd's runtime runs on an image's own python3): the areas are written through
``/proc/self/mem``, which a process may always do to itself, instead of ctypes (~1 MiB more in every PID 1).
"""

from __future__ import annotations

__all__ = ["ROOM_VARIABLE", "set_process_args"]

#: Padding in the environment of a process that will rewrite its areas (removed from ``os.environ`` at start):
#: the environ area keeps its exec-time size, so this is the room the rewritten environment gets.
ROOM_VARIABLE = "ADX_PRESTART_ROOM"


def set_process_args(argv: list[str], env: dict[str, str]) -> None:
    """Rewrite this process's argv and environ areas in place (as setproctitle does), so that
    ``/proc/self/cmdline`` and ``environ`` show ``argv`` and ``env`` as after an execve of them.

    The areas keep their size (moving them needs CAP_SYS_RESOURCE, which containers often lack): what does not
    fit is left out at an item boundary and the rest of each area is NUL, so a reader splitting on NUL sees
    trailing empty items. Whoever calls this must no longer read the old environment through libc (the area
    holds its strings): ``os.environ`` keeps its own copies.
    """
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])  # stat fields 48..51
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        for start, end, items in (
            (arg_start, arg_end, argv),
            (env_start, env_end, [f"{k}={v}" for k, v in env.items()]),
        ):
            size, raw = end - start, b""
            for item in items:
                encoded = item.encode() + b"\0"
                if len(raw) + len(encoded) > size:
                    break
                raw += encoded
            mem.seek(start)
            mem.write(raw.ljust(size, b"\0"))
