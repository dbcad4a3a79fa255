"""Slots, queue, timeouts, keepalives and disconnects, on a model with room for long generations."""

import socket
import threading
import time

import openai
import pytest

from mlx_spec.app.server.backend import Backend
from test_server_harness import EOS_BIAS, serve

LONG = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4000, "logit_bias": EOS_BIAS}


@pytest.fixture(scope="module")
def one_slot(long_target_dir):
    """One generation at a time, one waiting: the smallest server that can be full."""
    s = serve(long_target_dir, max_active=1, max_queue=1, keepalive_interval=0.1)
    yield s
    s.stop()


def running(server) -> float:
    return server.metric("num_requests_running")


def test_disconnect_mid_stream_frees_the_slot(one_slot):
    aborted = one_slot.metric("request_success_total", finished_reason="abort")
    generated = one_slot.metric("generation_tokens_total")
    with one_slot.http() as http, http.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
        lines = r.iter_lines()
        assert sum(line.startswith("data: ") for _, line in zip(range(6), lines)) >= 3
    # The client hung up after a few chunks: the slot is free long before 4000 tokens could be made.
    assert one_slot.wait_for(lambda: one_slot.metric("request_success_total", finished_reason="abort") == aborted + 1)
    assert running(one_slot) == 0
    assert one_slot.metric("generation_tokens_total") - generated < 2000
    r = one_slot.client().chat.completions.create(model="m", messages=LONG["messages"], max_tokens=3)
    assert r.usage.completion_tokens <= 3


def test_disconnect_while_waiting_for_a_non_streamed_answer(one_slot):
    aborted = one_slot.metric("request_success_total", finished_reason="abort")
    body = b'{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4000,"logit_bias":{"0":-100,"2":-100}}'
    with socket.create_connection(("127.0.0.1", one_slot.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert one_slot.wait_for(lambda: running(one_slot) == 1)
    assert one_slot.wait_for(lambda: one_slot.metric("request_success_total", finished_reason="abort") == aborted + 1)
    assert one_slot.wait_for(lambda: running(one_slot) == 0)


def test_full_queue_answers_429_with_retry_after_and_waiters_get_keepalives(one_slot):
    with one_slot.http() as a, one_slot.http() as b, one_slot.http() as c:
        with a.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as ra:
            first = ra.iter_lines()  # keep a reference: a dropped line iterator closes the response
            next(first)
            assert one_slot.wait_for(lambda: running(one_slot) == 1)
            with b.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as rb:
                lines = rb.iter_lines()
                assert next(lines).startswith("data: ")  # the role delta comes at once
                # While it waits for the slot, the stream stays alive with ':' comments.
                assert any(line.startswith(":") for _, line in zip(range(6), lines))
                r = c.post("/v1/chat/completions", json=LONG)
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["type"] == "rate_limit_error"
                with pytest.raises(openai.RateLimitError):
                    one_slot.client().chat.completions.create(model="m", **LONG)
    assert one_slot.wait_for(lambda: running(one_slot) == 0 and one_slot.metric("num_requests_waiting") == 0)


def test_request_timeout_stops_generation_as_length(long_target_dir):
    s = serve(long_target_dir, request_timeout=0.5)
    try:
        tic = time.monotonic()
        r = s.client().chat.completions.create(model="m", **LONG)
        assert time.monotonic() - tic < 10
        assert r.choices[0].finish_reason == "length" and r.model_extra["speculative"]["timed_out"]
        assert 0 < r.usage.completion_tokens < 4000
    finally:
        s.stop()


def test_health_is_503_while_the_model_loads(long_target_dir, monkeypatch):
    gate, real_load = threading.Event(), Backend.load
    monkeypatch.setattr(Backend, "load", lambda self: (gate.wait(30), real_load(self))[1])
    s = serve(long_target_dir, wait=False)
    try:
        assert s.wait_for(lambda: s.server.started)
        with s.http() as http:
            r = http.get("/health")
            assert r.status_code == 503 and r.json()["status"] == "loading" and "retry-after" in r.headers
            r = http.post("/v1/chat/completions", json=LONG)
            assert r.status_code == 503 and r.json()["error"]["code"] == "loading"
            gate.set()
            s.wait_ready()
            assert http.get("/health").status_code == 200
    finally:
        gate.set()
        s.stop()


def test_long_prefill_is_chunked_while_others_decode(long_target_dir):
    """A long prompt is prefilled a chunk per step; a streaming request keeps getting tokens meanwhile."""
    import threading
    import time

    from mlx_spec.app.server.config import ModelConfig, ServerConfig
    from test_server_harness import RunningServer

    s = RunningServer(ServerConfig(model=ModelConfig(target=str(long_target_dir), drafter=None, prefill_chunk=8)))
    try:
        client = s.client()
        a_times, b_first = [], []
        a_started = threading.Event()

        def stream_a():
            stream = client.chat.completions.create(model="m", stream=True, max_tokens=3000, logit_bias=EOS_BIAS,
                                                    messages=LONG["messages"])
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    a_times.append(time.monotonic())
                    a_started.set()
                if b_first:
                    stream.close()  # disconnect: frees the slot
                    break

        t = threading.Thread(target=stream_a)
        t.start()
        assert a_started.wait(30)
        long_prompt = " ".join(f"word{i}" for i in range(250))
        b_sent = time.monotonic()
        for chunk in client.chat.completions.create(model="m", stream=True, max_tokens=2,
                                                    messages=[{"role": "user", "content": long_prompt}]):
            if chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason) and not b_first:
                b_first.append(time.monotonic())
        t.join(60)
        during = [x for x in a_times if b_sent < x < b_first[0]]
        assert len(during) >= 10, (len(during), len(a_times))
    finally:
        s.stop()
