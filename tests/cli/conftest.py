"""Fixtures of the CLI tests: ``up_cluster``, a real ``adx up`` for a module (cli_helpers.py)."""

from cli_helpers import up_cluster

__all__ = ["up_cluster"]
