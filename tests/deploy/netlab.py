"""Machines on this host for the deployment test: each its own network namespace and address on one private
switch (a bridge in a namespace of its own, so nothing touches the host's network), its own filesystem root
for the ``/etc/adx``, ``/var/lib/adx`` and ``/mnt/adx-checkpoints`` paths of docs/deploy.md, and the daemons it
runs as real ``adx`` processes entered into its namespace with ``nsenter --net`` (``ip netns exec`` would
remount /sys and hide the cgroup tree sandboxd needs)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
ADX = str(Path(sys.executable).with_name("adx"))
PREFIX = 24  # every address is on 10.0.0.0/24, as in docs/deploy.md


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def in_netns(netns: str, work: Callable[[], T]) -> T:
    """``work()`` in a thread that joined network namespace ``netns`` (sockets it opens stay there)."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            result.append(work())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def tcp_open(netns: str, host: str, port: int) -> bool:
    def connect() -> bool:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return False
        return True

    return in_netns(netns, connect)


def wait_for(
    check: Callable[[], object], what: str, within: float = 60.0, log: Callable[[], str] | None = None
) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}" + (f"\n{log()}" if log else ""))
        time.sleep(0.2)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- {self.name} ({self.log}):\n" + "\n".join(text.splitlines()[-lines:])


@dataclass
class Machine:
    """One host of docs/deploy.md: a network namespace with ``addresses``, and a filesystem root."""

    name: str
    netns: str
    addresses: list[str]
    root: Path
    base_env: dict[str, str]
    processes: list[Process] = field(default_factory=list)

    def path(self, documented: str) -> Path:
        """Where this machine keeps the documented absolute path (``/etc/adx/...``)."""
        return self.root / documented.lstrip("/")

    def localize(self, text: str) -> str:
        """A documented file as installed on this machine: its absolute ADX paths under this machine's root."""
        for documented in ("/etc/adx", "/var/lib/adx", "/mnt/adx-checkpoints"):
            text = text.replace(documented, str(self.path(documented)))
        return text

    def install(self, documented: str, text: str, mode: int = 0o644) -> Path:
        target = self.path(documented)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.localize(text))
        target.chmod(mode)
        return target

    def env_file(self, documented: str) -> dict[str, str]:
        """KEY=VALUE lines, as systemd's EnvironmentFile= reads them."""
        values = {}
        for line in self.path(documented).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
        return values

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """One command on this machine (in its network namespace), to its end."""
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.base_env, **(env or {})},
            stdin=subprocess.DEVNULL,
        )

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        """A daemon on this machine: ``args`` in its network namespace, output to its log."""
        log = self.root / "log" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.netns}", "--", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.base_env, **(env or {})},
                start_new_session=True,
            )
        process = Process(f"{self.name}/{name}", popen, log)
        self.processes.append(process)
        return process

    def cut_off(self) -> None:
        """The machine drops off the network (its link goes down): nothing reaches it, it reaches nothing."""
        _ip("-n", self.netns, "link", "set", "eth0", "down")


class NetLab:
    """The switch and the machines; ``close()`` stops every process started here and removes the namespaces."""

    def __init__(self, root: Path, base_env: dict[str, str]) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.root = root
        self.base_env = base_env
        self.switch = f"adx{self.tag}-sw"
        self.machines: dict[str, Machine] = {}
        self.mounts: list[Path] = []  # unmounted by the test's fixture
        self._namespaces: list[str] = []
        self._add_netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def machine(self, name: str, *addresses: str) -> Machine:
        netns = f"adx{self.tag}-{name}"
        self._add_netns(netns)
        port = f"p{self.tag}{len(self.machines)}"  # the switch's side; names are at most 15 characters
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        for address in addresses:
            _ip("-n", netns, "addr", "add", f"{address}/{PREFIX}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        machine = Machine(name, netns, list(addresses), self.root / name, self.base_env)
        machine.root.mkdir(parents=True)
        self.machines[name] = machine
        return machine

    def colocated(self, name: str, host: Machine) -> Machine:
        """Another machine's role on ``host``'s network (its namespace and addresses), with files of its own."""
        machine = Machine(name, host.netns, host.addresses, self.root / name, self.base_env)
        machine.root.mkdir(parents=True)
        self.machines[name] = machine
        return machine

    def close(self) -> None:
        for machine in self.machines.values():
            for process in reversed(machine.processes):
                with contextlib.suppress(Exception):
                    process.stop()
        for name in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

    def logs(self) -> str:
        return "\n".join(p.tail() for m in self.machines.values() for p in m.processes)


def copy_files(sources: list[Path], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for source in sources:
        shutil.copy2(source, directory / source.name)
