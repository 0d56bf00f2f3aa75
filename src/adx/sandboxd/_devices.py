"""sandboxd's whole-device inventory (RES-2, RES-8): the accelerator/device IDs this host offers sandboxes.

Nothing is ever probed or invented (RES-3): the inventory is what the operator lists, in sandboxd's config
(``devices``) and/or in a devices file (``devices_file``: a JSON list of IDs) that a host tool may rewrite
while the daemon runs; the file is re-read on every resource refresh. A file that is missing or malformed
fails the refresh (the last good inventory stays, and health says the refresh is failing) rather than
reporting zero devices, which would read as "this host has none".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from adx.errors import InvalidInputError

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def check_device_id(value: str, where: str) -> str:
    if not DEVICE_ID.match(value):
        raise InvalidInputError(where, f"device ID {value!r} must match {DEVICE_ID.pattern}")
    return value


def read_devices_file(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInputError("devices_file", f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise InvalidInputError("devices_file", f"{path} is unreadable: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise InvalidInputError("devices_file", f"{path} must hold a JSON list of device ID strings")
    return [check_device_id(item, f"devices_file[{i}]") for i, item in enumerate(data)]


def device_inventory(configured: list[str], devices_file: Path | None) -> list[str]:
    """The configured IDs, then the file's, each once, in order."""
    ids = list(configured)
    if devices_file is not None:
        ids.extend(read_devices_file(devices_file))
    return list(dict.fromkeys(ids))
