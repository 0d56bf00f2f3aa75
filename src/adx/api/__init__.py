"""The public REST API server (``adx api``): Environments lifecycle over the Coordinator, OpenAPI documented.

The application is assembled here from the lifecycle routes, the agent-run routes, the Ingress's data plane and
the E2B layer; what they share (configuration, Coordinator client, request context, errors) is ``adx.gateway``,
which is also where code that only needs the configuration model imports it from (this package loads FastAPI).
"""

from adx.api._server import create_app, serve
from adx.gateway import ApiConfig, CoordinatorClient, Plane, Route

__all__ = ["ApiConfig", "CoordinatorClient", "Plane", "Route", "create_app", "serve"]
