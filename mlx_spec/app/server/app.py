"""The FastAPI application: middleware, error handlers, routes, and the scheduler's lifetime."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from . import anthropic, errors, responses_api, security
from .config import ServerConfig
from .routes import router
from .state import ServerState


def create_app(config: ServerConfig, backend=None) -> FastAPI:
    state = ServerState.build(config, backend)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.scheduler.start()  # loads the model on the worker thread; /health says 503 until then
        yield
        state.scheduler.close()
        await asyncio.to_thread(state.scheduler.stop)

    app = FastAPI(title="mlx-spec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  middleware=security.middleware(config))
    app.state.server = state
    errors.install(app)
    app.include_router(router)  # OpenAI: Chat Completions, Completions, models, health, metrics
    app.include_router(anthropic.router)  # Anthropic: Messages, count_tokens
    app.include_router(responses_api.router)  # OpenAI: Responses
    return app
