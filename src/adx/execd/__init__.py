"""Execd: the daemon inside every sandbox (PID 1).

It serves commands, files and health as HTTP/1.1 on a Unix socket, tracks client activity with an admission
gate (IDLE-2/3/6) and reports Ready, probe failures, workload checkpoint requests and activity changes to
sandboxd over a per-sandbox control socket (CTL-1).

This package's ``__init__`` stays empty on purpose: ``python -m adx.execd`` imports it inside every sandbox
and its idle memory is paid per sandbox. sandboxd imports :mod:`adx.execd._protocol` (standard library only),
the wire format its ControlHub (``adx.sandboxd._control_hub``) speaks with every execd.
"""
