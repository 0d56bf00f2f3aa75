"""A daemon of ADX (``adx <component> --config FILE``) as a real process that tests start, SIGKILL, SIGSTOP and
SIGCONT: shared by the node, Coordinator and fault tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class DaemonProcess:
    """``adx <component> --config FILE`` as a real process: started, SIGKILLed, SIGSTOPped, SIGCONTed."""

    def __init__(self, component: str, config: Path, log: Path) -> None:
        self.component = component
        self.config = config
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "adx", self.component, "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""
