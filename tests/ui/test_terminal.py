"""The dashboard's terminal in headless Chromium against a real ``adx up``: the Terminal action of a running
Environment starts a login shell on a real PTY in the sandbox (execd, through the Ingress), typed keys reach it
(Enter, Backspace, Ctrl-C), its output is drawn, resizing the panel resizes the PTY, and Close kills the shell so
it is gone from the Environment's command list. Screenshots of each step go where the dashboard's do."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect
from ui_helpers import Dashboard, shot, sign_in

pytestmark = pytest.mark.slow

STATE_TIMEOUT_MS = 90_000  # a real sandbox starting on a loaded 2-core machine
SHELL_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def running_env(dashboard: Dashboard) -> Iterator[str]:
    """A running Environment of the tenant, created through the API (the dashboard's create is tested elsewhere)."""
    with httpx.Client(
        base_url=dashboard.url, headers={"Authorization": f"Bearer {dashboard.tenant_key}"}, timeout=120
    ) as http:
        created = http.post(
            "/v1/environments", json={"image": "base", "resources": {"cpuMillis": 250, "memoryBytes": 128 << 20}}
        )
        assert created.status_code in (200, 201, 202), created.text
        env_id = created.json()["id"]
        try:
            yield env_id
        finally:
            http.delete(f"/v1/environments/{env_id}")


def commands(dashboard: Dashboard, env_id: str) -> list[dict[str, object]]:
    """The Environment's commands as the data plane lists them (execd drops a foreground command once it ends)."""
    with httpx.Client(base_url=dashboard.url, timeout=60) as http:
        answer = http.get(
            f"/v1/environments/{env_id}/commands", headers={"Authorization": f"Bearer {dashboard.tenant_key}"}
        )
        answer.raise_for_status()
        listed: list[dict[str, object]] = answer.json()["commands"]
        return listed


def run_line(page: Page, text: str) -> None:
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def open_terminal(page: Page, dashboard: Dashboard, env_id: str) -> tuple[Locator, Locator]:
    sign_in(page, dashboard.tenant_key)
    row = page.locator(f'tr[data-env-id="{env_id}"]')
    expect(row.locator(".state")).to_have_attribute("data-state", "running", timeout=STATE_TIMEOUT_MS)
    row.locator('[data-action="terminal"]').click()
    panel = page.locator("#terminal")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-command-id", re.compile(r"."), timeout=SHELL_TIMEOUT_MS)
    screen = page.locator("#term-screen")
    expect(screen).to_contain_text(re.compile(r"[#$]\s*$"), timeout=SHELL_TIMEOUT_MS)  # the shell's prompt
    screen.click()
    return panel, screen


def test_terminal_runs_a_shell_reads_keys_and_close_kills_it(
    page: Page, dashboard: Dashboard, running_env: str
) -> None:
    panel, screen = open_terminal(page, dashboard, running_env)
    command_id = panel.get_attribute("data-command-id")
    listed = {c["id"]: c for c in commands(dashboard, running_env)}
    assert command_id in listed and listed[command_id]["state"] == "running", listed
    shot(page, dashboard, "terminal-open")

    # The typed line holds `$((6*7))`; only the shell's arithmetic writes 42.
    run_line(page, "echo hello-$((6*7))")
    expect(screen).to_contain_text("hello-42", timeout=SHELL_TIMEOUT_MS)
    # The typed line holds /tmp too: the output is a line of its own.
    run_line(page, "cd /tmp && pwd")
    expect(screen).to_contain_text(re.compile(r"\n/tmp\n"), timeout=SHELL_TIMEOUT_MS)
    # Backspace edits the line before Enter: `echo bad` becomes `echo ok-` + 5.
    page.keyboard.type("echo bad")
    for _ in range(3):
        page.keyboard.press("Backspace")
    run_line(page, "ok-$((2+3))")
    expect(screen).to_contain_text(re.compile(r"\nok-5\n"), timeout=SHELL_TIMEOUT_MS)
    # Colours are dropped, CR and backspace move the cursor: `red-ab`, back one, `c`, to the start, `R`.
    run_line(page, r"printf '\033[1;31mred\033[0m-ab\bc\rR\n'")
    expect(screen).to_contain_text(re.compile(r"\nRed-ac\n"), timeout=SHELL_TIMEOUT_MS)
    shot(page, dashboard, "terminal-commands")

    # Ctrl-C reaches the terminal's line discipline: SIGINT ends sleep, and the shell reports 128 + 2.
    run_line(page, "sleep 100")
    time.sleep(1.0)  # let the shell start sleep: a Ctrl-C before it would only clear the line
    page.keyboard.press("Control+c")
    run_line(page, "echo status-$?")
    expect(screen).to_contain_text("status-130", timeout=SHELL_TIMEOUT_MS)
    shot(page, dashboard, "terminal-ctrl-c")

    # Resizing the panel resizes the PTY: the shell's `stty size` answers the panel's new rows and columns.
    before = (panel.get_attribute("data-rows"), panel.get_attribute("data-cols"))
    screen.evaluate("e => { e.style.height = '12rem'; e.style.width = '40rem'; }")
    expect(panel).not_to_have_attribute("data-rows", before[0] or "", timeout=SHELL_TIMEOUT_MS)
    expect(panel).not_to_have_attribute("data-cols", before[1] or "", timeout=SHELL_TIMEOUT_MS)
    time.sleep(0.5)  # the resize request follows the new size
    rows, cols = panel.get_attribute("data-rows"), panel.get_attribute("data-cols")
    run_line(page, "stty size")
    expect(screen).to_contain_text(re.compile(rf"\n{rows} {cols}\n"), timeout=SHELL_TIMEOUT_MS)
    shot(page, dashboard, "terminal-resized")

    page.click("#term-close")
    expect(panel).to_be_hidden()
    deadline = time.monotonic() + 30
    while command_id in {c["id"] for c in commands(dashboard, running_env)}:
        assert time.monotonic() < deadline, "the shell is still listed after Close"
        time.sleep(0.2)
    shot(page, dashboard, "terminal-closed")
