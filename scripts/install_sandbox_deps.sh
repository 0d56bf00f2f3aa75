#!/bin/sh
# Host packages sandboxd and its benchmark need (Debian/Ubuntu; run as root, e.g. in CI before the tests):
#   tar, zstd     checkpoint layers (GNU tar keeps overlayfs whiteouts and trusted.* xattrs; zstd compresses)
#   util-linux    setpriv (the tests run a client as another UID), chattr comes from e2fsprogs
#   runc          only for bench/bench_sandboxd.py's peer figure (sandboxd itself does not use it)
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends tar zstd util-linux e2fsprogs runc
