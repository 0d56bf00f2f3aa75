"""Helpers for execd tests: a handle on a real execd process, and small request helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from adx.execd import _protocol as P

STEP = 5.0  # every wait in the async tests is bounded


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not found for {pid}")


class ExecdProcess:
    def __init__(self, proc: subprocess.Popen[bytes], socket: Path, admin: Path, log: Path) -> None:
        self.proc = proc
        self.socket = socket
        self.admin_socket = admin
        self.log = log
        self._clients: list[httpx.Client] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, timeout: float = 30.0) -> httpx.Client:
        client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://execd", timeout=timeout
        )
        self._clients.append(client)
        return client

    def admin(self) -> httpx.Client:
        client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.admin_socket)), base_url="http://execd", timeout=10.0
        )
        self._clients.append(client)
        return client

    def activity(self) -> dict[str, Any]:
        with self.admin() as admin:
            result: dict[str, Any] = admin.get("/v1/activity").json()
            return result

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"execd exited with {self.proc.returncode}: {self.log.read_text()}")
            with contextlib.suppress(httpx.TransportError), self.client(timeout=1.0) as client:
                if client.get("/v1/health").status_code == 200:
                    return
            time.sleep(0.02)
        raise AssertionError(f"execd did not answer within {timeout}s: {self.log.read_text()}")

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def execd_command(socket: Path, admin: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "adx.execd", "--socket", str(socket), "--admin-socket", str(admin), *extra]


def run(client: httpx.Client, **body: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run a foreground command; return (data frames, final frame)."""
    frames: list[dict[str, Any]] = []
    with client.stream("POST", "/v1/commands", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line:
                frames.append(json.loads(line))
    assert "exitCode" in frames[-1], frames
    return [f for f in frames if "stream" in f], frames[-1]


def joined(frames: list[dict[str, Any]], stream: str) -> str:
    return "".join(f["data"] for f in frames if f["stream"] == stream)


class Subscriber:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.states: dict[str, Any] = {}
        self.deltas: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, path: Path) -> tuple[Subscriber, dict[str, Any]]:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=P.MAX_LINE)
        sub = cls(reader, writer)
        snapshot = await sub.next()
        assert snapshot["type"] == "snapshot"
        sub.states = dict(snapshot["sandboxes"])
        return sub, snapshot

    async def next(self, seconds: float = STEP) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), seconds)
        assert line, "subscription closed"
        message = json.loads(line)
        if message["type"] == "delta":
            self.deltas.append(message)
            if message["state"] is None:
                self.states.pop(message["sandboxId"], None)
            else:
                self.states[message["sandboxId"]] = message["state"]
        return message

    async def until(self, predicate: Callable[[dict[str, Any]], bool], seconds: float = STEP) -> None:
        """Consume messages until ``predicate(self.states)`` holds."""
        async with asyncio.timeout(seconds):
            while not predicate(self.states):
                await self.next(seconds)

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.writer.write(P.encode(message))
        await self.writer.drain()
        async with asyncio.timeout(STEP):
            while True:
                reply = await self.next()
                if reply["type"] == "reply" and reply.get("requestId") == message.get("requestId"):
                    return reply

    def close(self) -> None:
        self.writer.close()
