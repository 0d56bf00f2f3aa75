"""Real Redis and PostgreSQL server processes from pip-installed packages, kept in a state directory.

Used by ``adx up`` (the embedded default) and by the test fixtures.
"""

from adx.embedded._postgres import EmbeddedPostgres
from adx.embedded._process import ManagedServer, ServerInfo, ServerState, ServerStatus
from adx.embedded._redis import EmbeddedRedis

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "ManagedServer", "ServerInfo", "ServerState", "ServerStatus"]
