"""Sandbox host names (``PORT-ID.<proof>.DOMAIN``) and E2B's v1 file-URL signature, without a stack: the name
round-trips for any tenant name, and a changed tenant, sandbox, proof or base is never accepted."""

from __future__ import annotations

import pytest
from e2b.sandbox.signature import get_signature

from adx.e2b._hosts import base_domain, parse_host, sandbox_domain
from adx.e2b._signed import signature
from adx.e2b._tokens import EnvdTokens
from adx.errors import InvalidInputError
from adx.model import ENVIRONMENT, new_id


@pytest.mark.parametrize("tenant", ["default", "e2b-other", "T_" + "x" * 62, "ünïcode"])
def test_a_sandbox_host_name_names_its_tenant_and_sandbox(tenant: str) -> None:
    tokens = EnvdTokens(b"key")
    sandbox = new_id(ENVIRONMENT)
    domain = sandbox_domain(tokens, tenant, sandbox, "localhost:8080")
    host = f"8000-{sandbox}.{domain}"
    assert all(len(label) <= 63 for label in host.split(":")[0].split("."))
    parsed = parse_host(tokens, host, "localhost")
    assert parsed is not None and (parsed.port, parsed.sandbox_id, parsed.tenant) == (8000, sandbox, tenant)
    assert parse_host(tokens, host.upper(), "localhost") == parsed  # host names are case-insensitive


def test_a_host_name_the_api_did_not_hand_out_is_refused() -> None:
    tokens = EnvdTokens(b"key")
    sandbox, other = new_id(ENVIRONMENT), new_id(ENVIRONMENT)
    domain = sandbox_domain(tokens, "default", sandbox, "localhost:8080")
    with pytest.raises(InvalidInputError):  # the proof is for another sandbox
        parse_host(tokens, f"8000-{other}.{domain}", "localhost")
    forged = sandbox_domain(tokens, "default", sandbox, "x").replace("mrswmylvnr2a", "mvrtclljn52gqzls")
    with pytest.raises(InvalidInputError):  # another tenant's name with this proof
        parse_host(tokens, f"8000-{sandbox}.{forged[:-2]}.localhost:8080", "localhost")
    with pytest.raises(InvalidInputError):  # another API key
        parse_host(EnvdTokens(b"other key"), f"8000-{sandbox}.{domain}", "localhost")
    for bad in (f"0-{sandbox}.{domain}", f"8000-env-zz.{domain}", f"8000-{sandbox}.localhost"):
        with pytest.raises(InvalidInputError):
            parse_host(tokens, bad, "localhost")
    # Not under the base: the API itself, not a sandbox.
    assert parse_host(tokens, "127.0.0.1:8080", "localhost") is None
    assert parse_host(tokens, "localhost:8080", "localhost") is None
    assert parse_host(tokens, "api.localhost:8080", "localhost") is None
    assert parse_host(tokens, f"x-{sandbox}.{domain}", "localhost") is None
    assert parse_host(tokens, f"8000-{sandbox}.{domain}", "sandboxes.example.com") is None


def test_base_domain() -> None:
    assert base_domain("", 8080) == "localhost:8080"
    assert base_domain("", None) == "localhost"
    assert base_domain("sbx.example.com", 8080) == "sbx.example.com"


@pytest.mark.parametrize("expiration", [None, 60])
def test_the_signature_is_e2bs_v1(expiration: int | None) -> None:
    """Computed exactly as the installed SDK signs (its own function, not a copy)."""
    made = get_signature("/root/a b.txt", "write", None, "e2b1.x.y", expiration)
    assert made["signature"] == signature("/root/a b.txt", "write", "", "e2b1.x.y", made["expiration"])
    assert made["signature"] != signature("/root/a b.txt", "read", "", "e2b1.x.y", made["expiration"])
