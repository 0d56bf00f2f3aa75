"""SBX-4 / SEC-5: the private socket's modes, the peer-UID check, and owner/ID/generation/token checks."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import uuid

import pytest
from sbx_helpers import DaemonFactory

from adx.errors import ConflictError, NotFoundError
from adx.sandboxd import CreateRequest, PermissionDeniedError, SandboxRef, ref_of

RAW_CLIENT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("CONNECT-ERROR", exc.errno)
    raise SystemExit(0)
s.sendall(b"POST /v1/List HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.decode())
"""


def _as_nobody(socket_path: str, keep_dac_override: bool) -> str:
    caps = ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"] if keep_dac_override else []
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *caps]
    out = subprocess.run(
        [*nobody, "/usr/bin/python3", "-c", RAW_CLIENT, socket_path],
        capture_output=True,
        timeout=20,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


@pytest.mark.req("SBX-4", "SEC-5")
async def test_socket_is_private_and_another_uid_is_refused(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d.socket.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d.state_dir).st_mode) == 0o700
    # Without privileges another user cannot even reach the socket (directory + socket modes).
    assert _as_nobody(str(d.socket), keep_dac_override=False).startswith("CONNECT-ERROR 13")
    # A process of another UID that can bypass file modes (CAP_DAC_OVERRIDE) still meets SO_PEERCRED.
    reply = await asyncio.to_thread(_as_nobody, str(d.socket), True)
    head, _, body = reply.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 403"), reply
    err = json.loads(body)["error"]
    assert err["code"] == "permission_denied" and "uid 65534" in err["message"]
    # Same UID works.
    async with d.client() as c:
        assert await c.list() == []


@pytest.mark.req("SBX-4")
async def test_per_sandbox_calls_check_owner_id_generation_and_token(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        ref = ref_of(created)
        other = await c.create(CreateRequest(request_id="b", argv=["sleep", "1000"]))
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            await c.get(ref.model_copy(update={"token": "x" * 43}))
        with pytest.raises(PermissionDeniedError, match="invalid token"):
            # another sandbox's valid token does not open this one
            await c.delete(ref.model_copy(update={"token": other.token}))
        with pytest.raises(PermissionDeniedError, match="owner"):
            await c.stats(ref.model_copy(update={"owner": str(uuid.uuid4())}))
        with pytest.raises(ConflictError, match="generation"):
            await c.get(ref.model_copy(update={"generation": 2}))
        with pytest.raises(NotFoundError):
            await c.get(SandboxRef(sandbox_id="sb-nope", generation=1, token=ref.token))
        # The server validates too (a client need not be this typed one); errors name the field.
        resp = await c.raw("Create", {"request_id": "c", "argv": ["x"], "cwd": "relative"})
        assert resp.status_code == 422 and resp.json()["error"]["details"]["field"] == "cwd"
        # Nothing above changed anything: both still run; the good credentials still work.
        assert (await c.get(ref)).state == "running"
        # Create is idempotent by request ID: the same request returns the same sandbox and token.
        again = await c.create(CreateRequest(request_id="a", argv=["sleep", "1000"]))
        assert again.sandbox.sandbox_id == created.sandbox.sandbox_id and again.token == created.token
        with pytest.raises(ConflictError, match="different create"):
            await c.create(CreateRequest(request_id="a", argv=["sleep", "2000"]))
        await c.delete(ref)
        await c.delete(ref_of(other))


@pytest.mark.req("SBX-4")
async def test_a_caller_chosen_token_addresses_the_sandbox_even_without_the_reply(sandboxd: DaemonFactory) -> None:
    """The caller may choose the secret (so a lost Create reply leaves the sandbox addressable); it is then the
    only one accepted, a replay returns it, and a malformed one is refused naming the field."""
    d = sandboxd()
    secret = "s3cret-" + "x" * 40
    async with d.client() as c:
        request = CreateRequest(request_id="chosen", sandbox_id="chosen-1", token=secret, argv=["sleep", "1000"])
        created = await c.create(request)
        assert ref_of(created).token == secret
        # Addressed with what the caller knew before the call, not with the reply:
        planned = SandboxRef(sandbox_id="chosen-1", generation=1, token=secret)
        assert (await c.get(planned)).sandbox_id == "chosen-1"
        with pytest.raises(PermissionDeniedError):
            await c.get(SandboxRef(sandbox_id="chosen-1", generation=1, token="y" * 43))
        assert ref_of(await c.create(request)).token == secret  # an idempotent replay
        raw = await c.raw("Create", {"request_id": "short", "argv": ["true"], "token": "short"})
        assert raw.status_code in (400, 422) and "token" in raw.content.decode(), raw
        await c.delete(planned)
