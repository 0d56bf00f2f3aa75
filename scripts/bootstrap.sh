#!/usr/bin/env bash
# Installs everything ADX needs into ./.venv (idempotent) on a Debian/Ubuntu machine with Python 3.11+.
# Sourced by the other scripts; afterwards "$ADX_UV" is the uv command to use.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ADX needs Python 3.11 or newer")'

# System tools the runtime uses (installed only if missing): unshare/setpriv (util-linux), ip (iproute2),
# GNU tar + zstd (sandbox checkpoints), chattr (e2fsprogs), mkfs.btrfs (btrfs-progs: sandboxd's enforced disk),
# nft (nftables: sandbox network policy), mmdebstrap (the Debian base image), chromium (the dashboard's browser
# tests). runc is only bench/bench_sandboxd.py's peer figure: scripts/install_sandbox_deps.sh installs it.
missing=()
command -v unshare >/dev/null || missing+=(util-linux)
command -v setpriv >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
command -v zstd >/dev/null || missing+=(zstd)
command -v tar >/dev/null || missing+=(tar)
command -v chattr >/dev/null || missing+=(e2fsprogs)
command -v mkfs.btrfs >/dev/null || missing+=(btrfs-progs) # sandboxd's disk_quota = "btrfs"
command -v nft >/dev/null || missing+=(nftables)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap) # the Debian base image (adx image, docs/images.md)
# The dashboard's browser tests (tests/ui) drive Debian's chromium through Playwright: no browser download.
command -v chromium >/dev/null || missing+=(chromium)
command -v systemd-analyze >/dev/null || missing+=(systemd) # tests/deploy: verifies deploy/systemd units
if ((${#missing[@]})) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "bootstrap: installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

# uv manages the virtual environment from uv.lock. Take it from PyPI with pip; Debian marks the system
# Python "externally managed", hence the fallbacks.
if ! "$PYTHON" -m uv --version >/dev/null 2>&1; then
  echo "bootstrap: installing uv" >&2
  if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip python3-venv >/dev/null
    fi
  fi
  "$PYTHON" -m pip install -q uv 2>/dev/null || "$PYTHON" -m pip install -q --break-system-packages uv
fi

export UV_PYTHON_DOWNLOADS=never
export UV_PYTHON="$PYTHON"
ADX_UV="$PYTHON -m uv"
# The server extra: this checkout runs the daemons and the tests (a client-only install is `pip install .`).
$ADX_UV sync --frozen --quiet --extra server
export ADX_UV
