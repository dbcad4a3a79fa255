"""Running the app under uvicorn, with the limits its defaults leave open."""

from __future__ import annotations

import math

import uvicorn

from .config import ServerConfig
from .connections import ConnectionLimits, protocol_class


class Server(uvicorn.Server):
    """Stops admitting on the first signal, lets in-flight requests finish, and exits if the model fails to load."""

    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame) -> None:
        self.state.scheduler.close()  # new requests get 503 while the rest finish
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.state.scheduler.load_error is not None:
            return True
        return await super().on_tick(counter)


def uvicorn_config(app, cfg: ServerConfig) -> uvicorn.Config:
    # h11 with a header-size cap: httptools has no cap (vLLM CVE-2025-48956, header flood).
    # No limit_concurrency: it counts idle sockets too; connections.py and the scheduler's queue bound the load.
    limits = ConnectionLimits(cfg.max_connections, cfg.header_timeout, cfg.body_timeout)
    return uvicorn.Config(
        app, host=cfg.host, port=cfg.port, http=protocol_class(limits), h11_max_incomplete_event_size=cfg.max_header_bytes,
        timeout_graceful_shutdown=math.ceil(cfg.shutdown_timeout), timeout_keep_alive=5,
        limit_concurrency=None, proxy_headers=False, server_header=False, log_level=cfg.log_level, lifespan="on")


def make_server(app, cfg: ServerConfig) -> Server:
    return Server(uvicorn_config(app, cfg), app.state.server)
