"""A real uvicorn server on a free loopback port, in a thread, for the server tests (no tests here)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import httpx2 as httpx
import openai
import pytest

import mlx_spec

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


def serve(target, drafter=None, wait=True, block_size=None, **overrides) -> RunningServer:
    model = ModelConfig(target=str(target), drafter=drafter and str(drafter), block_size=block_size)
    return RunningServer(ServerConfig(model=model, **overrides), wait=wait)


def server_fixture(**overrides):
    """A module-scoped `server` fixture: the test target served with `overrides`, stopped after the module."""

    @pytest.fixture(scope="module")
    def server(target_dir):
        s = serve(target_dir, **overrides)
        yield s
        s.stop()

    return server


def plain_library_fixture():
    """A module-scoped `library` fixture: the test target loaded in-process without a drafter."""

    @pytest.fixture(scope="module")
    def library(target_dir):
        return mlx_spec.load(target_dir, drafter=None)

    return library


class PlayBack:
    """Stands in for `mlx_spec.Generation`, playing back scripted responses (or raising)."""

    def __init__(self, responses):
        self.responses, self.finished = responses, False

    def prefill(self, chunk):
        yield self.advance()

    def advance(self):
        r = next(self.responses)
        self.finished = r.finish_reason is not None
        return r


def script(pieces: list[str], finish: str = "stop"):
    """A play_back script whose every request replies with `pieces`, one per round."""

    def replies(ids):
        for i, text in enumerate(pieces):
            yield mlx_spec.GenerationResponse(text=text, token=1, tokens=[1], prompt_tokens=len(ids), prompt_tps=0.0,
                                              generation_tokens=i + 1, generation_tps=0.0, peak_memory=0.0,
                                              finish_reason=finish if i == len(pieces) - 1 else None)

    return replies


def play_back(monkeypatch, script):
    """Every request the server starts plays back `script(prompt_ids)`, an iterator of responses."""
    monkeypatch.setattr(mlx_spec, "make_generation", lambda model, tok, ids, max_tokens, **kw: PlayBack(script(ids)))
    monkeypatch.setattr(mlx_spec, "step_all", lambda model, gens: [g.advance() for g in gens])


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
