"""A real uvicorn server on a free loopback port, in a thread, for the server tests (no tests here)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import httpx2 as httpx
import openai

from mlx_spec.app.server.app import create_app
from mlx_spec.app.server.config import ModelConfig, ServerConfig
from mlx_spec.app.server.serve import make_server

EOS_BIAS = {"0": -100, "2": -100}  # keeps the random test models from stopping early


class RunningServer:
    def __init__(self, cfg: ServerConfig, wait: bool = True):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.cfg = dataclasses.replace(cfg, port=self.port, log_level="warning")
        self.app = create_app(self.cfg)
        self.state = self.app.state.server
        self.server = make_server(self.app, self.cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.server.started and self.state.status == "ok":
                return
            if self.state.scheduler.load_error is not None:
                raise self.state.scheduler.load_error
            time.sleep(0.02)
        raise TimeoutError("server did not become ready")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0,
                                  timeout=kw.pop("timeout", 60), **kw)

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 30), **kw)

    def metric(self, name: str, **labels) -> float:
        """One sample from /metrics (read from the app, so it works whatever the auth settings)."""
        want = [f'{k}="{v}"' for k, v in labels.items()]
        for line in self.state.metrics.render().splitlines():
            if line.startswith(f"mlx_spec:{name}{{") and all(w in line for w in want):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_for(self, predicate, timeout: float = 15.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def serve(target, drafter=None, wait=True, **overrides) -> RunningServer:
    model = ModelConfig(target=str(target), drafter=drafter and str(drafter))
    return RunningServer(ServerConfig(model=model, **overrides), wait=wait)


def sse_events(lines) -> list:
    """Raw SSE lines to a list of parsed JSON payloads, ':' comments as ':', and '[DONE]'."""
    out = []
    for line in lines:
        if line.startswith(":"):
            out.append(":")
        elif line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
