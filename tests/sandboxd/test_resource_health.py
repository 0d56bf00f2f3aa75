"""sandboxd's device inventory (RES-2) and the health of its own resource refresh (RES-8), on a real daemon."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory

from adx.errors import UnavailableError


@pytest.mark.req("RES-2", "RES-8")
async def test_devices_come_from_config_and_a_devices_file_and_health_reports_refresh_failures(
    sandboxd: DaemonFactory, tmp_path: Path
) -> None:
    devices_file = tmp_path / "devices.json"
    devices_file.write_text(json.dumps(["npu0", "gpu1"]))
    d = sandboxd(devices=["gpu0", "gpu1"], devices_file=str(devices_file), resource_refresh_seconds=0.2)
    client = d.client()
    try:
        info = await client.resource()
        assert info.device_ids == ["gpu0", "gpu1", "npu0"]  # configured first, each once
        health = await client.health()
        assert health.ok and health.resource_fresh and health.resource_error is None
        assert health.state_dir == str(d.state_dir)

        # The file is re-read on each refresh: a host tool may change the inventory while the daemon runs.
        devices_file.write_text(json.dumps(["npu0", "npu1"]))
        assert (await client.resource()).device_ids == ["gpu0", "gpu1", "npu0", "npu1"]

        # A malformed inventory fails the refresh (never "no devices"): the Resource call says so, health
        # names the error at once, and once the last good sample ages past its validity health turns not-fresh.
        devices_file.write_text('{"not": "a list"}')
        with pytest.raises(UnavailableError, match="devices_file"):
            await client.resource()
        health = await client.health()
        assert health.resource_error is not None and "devices_file" in health.resource_error
        deadline = time.monotonic() + 10
        while (await client.health()).resource_fresh:
            assert time.monotonic() < deadline, "the failing refresh never made the resource data stale"
            await asyncio.sleep(0.1)
        health = await client.health()
        assert not health.ok and not health.resource_fresh and health.resource_age_seconds > 0.6

        # Fixed: the periodic refresh (maintenance kept running) makes it fresh again without a call.
        devices_file.write_text(json.dumps(["npu0"]))
        deadline = time.monotonic() + 10
        while not (health := await client.health()).resource_fresh:
            assert time.monotonic() < deadline, "the refresh did not recover"
            await asyncio.sleep(0.1)
        assert health.ok and health.resource_error is None
        assert (await client.resource()).device_ids == ["gpu0", "gpu1", "npu0"]
    finally:
        await client.aclose()


@pytest.mark.req("RES-8")
async def test_a_daemon_whose_first_refresh_fails_starts_and_says_why(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    d = sandboxd(devices_file=str(tmp_path / "missing.json"))
    client = d.client()
    try:
        health = await client.health()
        assert not health.ok and not health.resource_fresh
        assert health.resource_error is not None and "missing.json does not exist" in health.resource_error
    finally:
        await client.aclose()


def test_a_bad_configured_device_id_names_the_field(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False, devices=["gpu 0"])
    status, output = d.run_to_exit()
    assert status != 0
    assert "devices" in output and "'gpu 0' must match" in output
