"""The ``adx`` command line."""

from adx.cli._app import app, main

__all__ = ["app", "main"]
