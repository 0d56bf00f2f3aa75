"""nftables scripts run in process through libnftables (issue 13: no ``nft`` fork+exec on a veth create's path),
with ``nft -f -`` as the fallback where the library cannot be loaded: both apply the same transaction, both
refuse a bad script with nft's own message, and the kernel's ruleset is what ``nft list`` shows either way."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from adx.errors import UnavailableError
from adx.sandboxd._nft import Nft

pytestmark = pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables")


@pytest.fixture
def table() -> Iterator[str]:
    name = f"adxtest_{secrets.token_hex(4)}"
    yield name
    subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True, check=False)


def _script(table: str, verdict: str) -> str:
    return (
        f"add table inet {table}\nadd chain inet {table} sb_x\nflush chain inet {table} sb_x\n"
        f"add rule inet {table} sb_x ip daddr 192.0.2.0/24 {verdict}\n"
    )


def _listed(table: str) -> str:
    return subprocess.run(["nft", "list", "table", "inet", table], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("in_process", [True, False], ids=["libnftables", "nft-binary"])
def test_a_script_is_one_transaction_and_a_bad_one_changes_nothing(table: str, in_process: bool) -> None:
    nft = Nft()
    assert nft.in_process, "libnftables is installed with nftables (Debian's libnftables1)"
    if not in_process:
        nft._library = None  # where the library cannot be loaded
    nft.run(_script(table, "accept"))
    assert "ip daddr 192.0.2.0/24 accept" in _listed(table)
    nft.run(_script(table, "drop"))  # the flush and the refill together: the chain holds only the new rule
    listed = _listed(table)
    assert "192.0.2.0/24 drop" in listed and "accept" not in listed
    bad = _script(table, "accept") + f"add rule inet {table} no_such_chain accept\n"
    with pytest.raises(UnavailableError, match=r"nft failed: .*No such file or directory"):
        nft.run(bad)
    assert _listed(table) == listed  # the whole transaction was refused, its flush too
    nft.run(_script(table, "accept"))  # and the context is usable after a refusal
    assert "192.0.2.0/24 accept" in _listed(table)


def test_without_nftables_the_call_says_what_to_install() -> None:
    nft = Nft()
    nft._library, nft.binary = None, None
    assert not nft.available
    with pytest.raises(UnavailableError, match="nftables package"):
        nft.run("list ruleset\n")
