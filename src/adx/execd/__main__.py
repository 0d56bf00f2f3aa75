"""Lean entry point: ``python -m adx.execd --socket PATH [options] [-- WORKLOAD ARGV...]``.

This is what runs inside every sandbox. It deliberately avoids the ``adx`` CLI (typer, rich, pydantic): the
interpreter's idle memory here is paid once per sandbox. ``adx execd`` validates a TOML config and execs this.
"""

from __future__ import annotations

import sys

# execd speaks only over Unix sockets: keep asyncio from loading the ssl module (and libssl/libcrypto),
# which is ~4 MiB of resident memory in every sandbox for nothing.
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

from adx.execd._main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
