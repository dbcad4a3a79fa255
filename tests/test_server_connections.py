"""Idle and trickling sockets (raw, loopback only) cannot starve real clients; read deadlines close them."""

import socket
import time

import pytest

from test_server_harness import serve

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed `sock` (sending `trickle` a byte at a time meanwhile); None if it did not."""
    start = time.monotonic()
    sock.settimeout(0.25)
    i = 0
    while time.monotonic() - start < seconds:
        try:
            if i < len(trickle):
                sock.send(trickle[i:i + 1])
                i += 1
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except socket.timeout:
            continue
        except OSError:  # reset or broken pipe: closed too
            return time.monotonic() - start
    return None


@pytest.fixture(scope="module")
def server(target_dir):
    s = serve(target_dir, max_active=1, max_queue=1, max_connections=24, header_timeout=1.0, body_timeout=1.0)
    yield s
    s.stop()


def test_idle_sockets_do_not_crowd_out_real_clients(server):
    # Before: uvicorn counted these against limit_concurrency (max_active + max_queue + 64) and answered 503.
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(90)]
    try:
        time.sleep(0.2)
        for _ in range(3):
            r = server.client(timeout=10).chat.completions.create(model="m", **CHAT)
            assert r.usage.completion_tokens <= 2
        with server.http() as http:
            assert http.get("/health").status_code == 200
        assert len(server.server.server_state.connections) <= 24  # the oldest idle ones were closed
    finally:
        for s in idle:
            s.close()


def test_headers_trickled_a_byte_at_a_time_time_out(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        took = closed_within(s, 6.0, trickle=b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200)
    assert took is not None and took < 4.0, took


def test_a_connection_that_never_speaks_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        took = closed_within(s, 6.0)
    assert took is not None and took < 4.0, took


def test_a_trickled_body_times_out_and_frees_its_connection(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head)
        took = closed_within(s, 6.0, trickle=b'{"messages": [' + b" " * 100)
    assert took is not None and took < 4.0, took
    assert server.client().chat.completions.create(model="m", **CHAT).choices[0].finish_reason


def test_keep_alive_clients_and_slow_generations_are_not_cut(server):
    with server.http() as http:  # one connection, reused after longer than the header timeout
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        time.sleep(0.5)
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        # While the app generates, no read deadline runs (it is the app's time, not the socket's).
        r = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 400, "logit_bias": {"0": -100, "2": -100}})
        assert r.status_code == 200
