"""Running the API server (and/or the Ingress) under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import socket

import uvicorn

from adx._certs import Identity, component_paths
from adx.api._app import create_app
from adx.api._config import ApiConfig, split_host_port
from adx.errors import UnavailableError

log = logging.getLogger("adx.api")


class _Server(uvicorn.Server):
    """uvicorn's server, logging the bound address (``listen`` may ask for port 0) once it accepts."""

    component = "api"

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            bound = [s.getsockname() for srv in self.servers for s in (srv.sockets or ())]
            host, port = (bound[0][0], bound[0][1]) if bound else (self.config.host, self.config.port)
            log.info(f"{self.component} serving", extra={"url": f"http://{host}:{port}"})


async def serve(config: ApiConfig, *, api: bool = True, ingress: bool | None = None, component: str = "api") -> None:
    # Fail at once with the file's name if our certificate is missing (instead of on the first request).
    component_paths(config.certs_dir, Identity("api", config.name)).read()
    host, port = split_host_port(config.listen)
    app = create_app(config, api=api, ingress=ingress)
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_config=None,  # our own structured logging (adx.logs) stays in charge
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
    )
    server.component = component
    await server.serve()
    if not server.started:
        raise UnavailableError(f"{component}: could not start on {config.listen} (see the log above)")
