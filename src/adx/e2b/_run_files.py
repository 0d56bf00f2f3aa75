"""envd's ``/run/e2b/.E2B_*`` files, written into every sandbox the E2B API starts.

envd makes ``/run/e2b`` (0755) when it starts and writes there, root's and without a newline: ``.E2B_SANDBOX``
(``true``, 0444) and, once it learns them, ``.E2B_SANDBOX_ID`` and ``.E2B_TEMPLATE_ID`` (0666 under its 022
umask: 0644). Programs read them where the ``E2B_*`` variables are not passed on (``sudo``, cron, services).

ADX's execd knows nothing of E2B, so the API writes them through execd's files API (as root, each write atomic)
once the sandbox runs: at create (also from a snapshot, and each fork, whose copied files name their source),
and again at a resume through ``connect``. ``/run`` is part of the sandbox's writable layer, which a pause keeps,
so a sandbox woken by its own traffic has them too.

As envd writes them after its start (a goroutine, not before it serves), the writes run in the background: the
create answers without waiting for them (they cost a round trip to the node), and every envd call of that
sandbox that reaches this API process waits for them first (:func:`run_files_written`), so a program's first
command or file read finds them.
"""

from __future__ import annotations

import asyncio
import logging

from adx.e2b._upstream import Execd, execd_error
from adx.ingress import Ingress
from adx.model import EnvironmentRecord

RUN_DIR = "/run/e2b"
_log = logging.getLogger(__name__)


def run_files(record: EnvironmentRecord) -> dict[str, tuple[str, str]]:
    """Each file's name -> (content, octal mode), as envd writes them."""
    return {
        ".E2B_SANDBOX": ("true", "444"),
        ".E2B_SANDBOX_ID": (record.id, "644"),
        ".E2B_TEMPLATE_ID": (record.spec.image, "644"),
    }


#: Writes under way, by (tenant, sandbox): that sandbox's envd calls in this process wait for them first.
_PENDING: dict[tuple[str, str], asyncio.Task[None]] = {}


def start_run_files(ingress: Ingress | None, record: EnvironmentRecord) -> None:
    """:func:`write_run_files` in the background (see the module's docstring)."""
    if ingress is None:
        return
    key = (record.tenant, record.id)
    task = asyncio.get_running_loop().create_task(_write_logged(ingress, record), name="e2b-run-files")
    _PENDING[key] = task

    def done(finished: asyncio.Task[None]) -> None:
        if _PENDING.get(key) is finished:
            del _PENDING[key]

    task.add_done_callback(done)


async def run_files_written(tenant: str, sandbox_id: str) -> None:
    """Wait for the sandbox's run files where this process is writing them (at once when it is not)."""
    task = _PENDING.get((tenant, sandbox_id))
    if task is not None:
        await asyncio.shield(task)  # a call cancelled meanwhile does not cancel the writes


async def _write_logged(ingress: Ingress, record: EnvironmentRecord) -> None:
    try:
        await write_run_files(ingress, record)
    except Exception as exc:  # the sandbox went away meanwhile: nothing to write into
        _log.warning("sandbox %s: its /run/e2b files were not written: %s", record.id, exc)


async def write_run_files(ingress: Ingress | None, record: EnvironmentRecord) -> None:
    """Write the files into the running sandbox ``record`` names (nothing without a data plane: nothing could
    read them either). A failure is logged, as envd logs its own, and the sandbox serves on without them."""
    if ingress is None:
        return
    execd = Execd(ingress, record.tenant, record.id)

    async def write(name: str, content: str, mode: str) -> None:
        path = f"{RUN_DIR}/{name}"
        status, body = await execd.call(
            "PUT",
            "/v1/files",
            query={"path": path, "mode": mode, "mkdirs": "true", "durable": "false"},
            content=content.encode(),
        )
        if status != 201:
            _log.warning("sandbox %s: cannot write %s: %s", record.id, path, _reason(status, body))

    # At once (each is a round trip to the node): ``mkdirs`` makes /run/e2b for whichever comes first. Not synced
    # to disk (rewritten at every start and resume; a pause's checkpoint reads them as any file).
    await asyncio.gather(*(write(name, *value) for name, value in run_files(record).items()))


def _reason(status: int, body: bytes) -> str:
    code, message = execd_error(body)
    return f"execd answered {status} ({code}): {message}"
