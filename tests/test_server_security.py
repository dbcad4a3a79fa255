"""Auth, Host and CORS gates, request-size limits, malformed input and a schema fuzz: never a crash, never a 5xx."""

import json
import random
import socket

import openai
import pytest

from mlx_spec import MlxSpecError
from mlx_spec.app.server.config import ServerConfig
from mlx_spec.cli import main as cli_main
from test_server_harness import serve

KEY = "test-key-123456"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(target_dir):
    s = serve(target_dir, api_keys=(KEY,), max_body_bytes=64 << 10, max_header_bytes=8 << 10, request_timeout=2.0)
    yield s
    s.stop()


def auth(**extra):
    return {"Authorization": f"Bearer {KEY}", **extra}


def test_api_key(server):
    with server.http() as http:
        r = http.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.post("/v1/chat/completions", json=CHAT, headers={"X-Api-Key": KEY}).status_code == 200
        assert http.get("/metrics").status_code == 401
        assert http.get("/health").status_code == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="nope").models.list()
    assert server.client(api_key=KEY).chat.completions.create(model="m", **CHAT).usage.completion_tokens <= 2


def test_host_header_allowlist(server):
    with server.http() as http:
        for host in ("localhost", f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}"):
            assert http.get("/health", headers={"Host": host}).status_code == 200, host
        r = http.get("/health", headers={"Host": "attacker.example:8080"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


def test_cors_localhost_only(server):
    with server.http() as http:
        ok = http.get("/v1/models", headers=auth(Origin="http://localhost:3000"))
        assert ok.headers.get("access-control-allow-origin") == "http://localhost:3000"
        assert "access-control-allow-credentials" not in ok.headers
        bad = http.get("/v1/models", headers=auth(Origin="http://evil.example"))
        assert "access-control-allow-origin" not in bad.headers
        pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
        assert http.options("/v1/chat/completions", headers={"Origin": "http://127.0.0.1:5173", **pre}).status_code == 200
        assert http.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **pre}).status_code == 400


def test_refuses_non_loopback_without_key(capsys):
    with pytest.raises(MlxSpecError):
        ServerConfig(host="0.0.0.0")
    assert ServerConfig(host="0.0.0.0", api_keys=(KEY,)).host == "0.0.0.0"
    assert cli_main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "api-key" in capsys.readouterr().err


def test_body_size_limits(server):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (100 << 10)}]}
    with server.http() as http:
        r = http.post("/v1/chat/completions", json=big, headers=auth())
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        chunked = (json.dumps(big)[i:i + 4096].encode() for i in range(0, 110 << 10, 4096))
        r = http.post("/v1/chat/completions", content=chunked, headers=auth(**{"Content-Type": "application/json"}))
        assert r.status_code == 413


def raw(port: int, data: bytes) -> bytes:
    """Send bytes, return the reply; the server may answer and hang up before reading them all."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return out


def test_oversized_headers_and_garbage(server):
    header = b"X-Filler: " + b"a" * (20 << 10) + b"\r\n"
    reply = raw(server.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + header + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 400") and b"headers_too_large" in reply
    huge = b"X-Filler: " + b"a" * (200 << 10) + b"\r\n"  # past what h11 buffers: refused by h11 itself
    assert raw(server.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + huge + b"\r\n").startswith(b"HTTP/1.1 400")
    assert raw(server.port, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400")


def test_malformed_bodies(server):
    bodies = [b"{", b"[]", b"null", b'"text"', b'{"messages": NaN}', b'{"messages": ' + b'[' * 20000,
              b'{"messages":[{"role":"user","content":"hi"}],"temperature":Infinity}', b"\xff\xfe"]
    with server.http() as http:
        for body in bodies:
            r = http.post("/v1/chat/completions", content=body, headers=auth(**{"Content-Type": "application/json"}))
            assert r.status_code == 400 and "error" in r.json(), body[:30]


def test_model_field_never_loads_a_path(server):
    c = server.client(api_key=KEY)
    r = c.chat.completions.create(model="../../../../etc/passwd", **CHAT)
    assert r.model == server.state.info.id


VALUES = [None, True, -1, 0, 2**70, -2**70, 1e308, -0.5, 3.5, "", "x" * 5000, "\u0000\udbff", [], [1, -5, 2**40],
          [[]], {}, {"a": {"b": [None]}}, [{"role": "user"}], [{"type": "image_url", "image_url": {"url": "file:///etc"}}]]
FIELDS = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
          "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "stream",
          "stream_options", "n", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format", "model"]


def test_fuzz_request_schema(server):
    rng = random.Random(0)
    statuses = set()
    with server.http(timeout=30) as http:
        for i in range(160):
            body = json.loads(json.dumps(CHAT))
            for _ in range(rng.randint(1, 3)):
                body[rng.choice(FIELDS)] = rng.choice(VALUES)
            if rng.random() < 0.3:
                body["messages"] = [{"role": rng.choice(["user", "tool", "assistant", "x"]),
                                     "content": rng.choice(VALUES)}]
            path = rng.choice(["/v1/chat/completions", "/v1/completions"])
            if path == "/v1/completions":
                body["prompt"] = rng.choice(VALUES + ["def add"])
            try:
                payload = json.dumps(body).encode()
            except (UnicodeEncodeError, ValueError):
                continue
            r = http.post(path, content=payload, headers=auth(**{"Content-Type": "application/json"}))
            statuses.add(r.status_code)
            assert r.status_code < 500, (body, r.text[:300])
            if r.status_code >= 400:
                assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    assert 400 in statuses and 200 in statuses
    assert server.client(api_key=KEY).chat.completions.create(model="m", **CHAT).choices[0].finish_reason
