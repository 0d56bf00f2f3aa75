"""The Health service over a real gRPC server (Unix socket) and the checked-in stubs' freshness."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from adx._health import NOT_SERVING, SERVING, HealthServicer, check_health
from adx.errors import NotFoundError, UnavailableError
from adx.proto import health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


async def test_health_check_over_real_grpc(tmp_path: Path) -> None:
    servicer = HealthServicer("testd")
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    target = f"unix://{tmp_path}/health.sock"
    server.add_insecure_port(target)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            first = await check_health(channel)
            assert (first.status, first.detail, first.component) == (NOT_SERVING, "starting", "testd")
            servicer.set_serving()
            assert (await check_health(channel)).status == SERVING
            servicer.set_not_serving("redis unreachable", service="store")
            store = await check_health(channel, "store")
            assert (store.status, store.detail) == (NOT_SERVING, "redis unreachable")
            with pytest.raises(NotFoundError, match="unknown service 'nope'"):
                await check_health(channel, "nope")
    finally:
        await server.stop(grace=None)
    async with grpc.aio.insecure_channel(target) as channel:
        with pytest.raises(UnavailableError, match="UNAVAILABLE"):
            await check_health(channel, rpc_timeout=1.0)


def test_checked_in_stubs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    copy = tmp_path / "adx" / "proto"
    shutil.copytree(ROOT / "src" / "adx" / "proto", copy)
    stub = copy / "health_pb2.py"
    stub.write_bytes(stub.read_bytes() + b"\n# edited by hand\n")
    (copy / "health_pb2_grpc.pyi").unlink()
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check", "--src", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "health_pb2.py, health_pb2_grpc.pyi" in result.stderr
