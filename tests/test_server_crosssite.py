"""Cross-site requests a web page can make to a keyless loopback server: refused before any work."""

import json

import pytest

from test_server_harness import serve

BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def server(target_dir):
    s = serve(target_dir)  # no key: what a browser on any site can reach at 127.0.0.1
    yield s
    s.stop()


def finished(server) -> float:
    return server.metric("prompt_tokens_total")


# The "simple" requests a browser sends cross-site without a CORS preflight: a form post, a
# multipart form, fetch() with a string (text/plain) or a Blob without a type (no Content-Type).
SIMPLE = [
    {"Content-Type": "text/plain;charset=UTF-8"},
    {"Content-Type": "application/x-www-form-urlencoded"},
    {"Content-Type": "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW"},
    {},
]


@pytest.mark.parametrize("headers", SIMPLE, ids=["text-plain", "form", "multipart", "no-type"])
def test_simple_cross_site_posts_are_refused_before_any_work(server, headers):
    before = finished(server)
    body = BODY if "multipart" not in str(headers) else (
        '------WebKitFormBoundary7MA4YWxkTrZu0gW\r\nContent-Disposition: form-data; name="x"\r\n\r\n'
        f'{BODY}\r\n------WebKitFormBoundary7MA4YWxkTrZu0gW--\r\n')
    with server.http() as http:
        for path in ("/v1/chat/completions", "/v1/completions", "/chat/completions"):
            r = http.post(path, content=body, headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (path, r.text)
            r = http.post(path, content=body, headers={**headers, "Origin": EVIL, "Referer": f"{EVIL}/page",
                                                       "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", (path, r.text)
            assert "access-control-allow-origin" not in r.headers
    assert finished(server) == before  # nothing was generated


def test_foreign_origins_are_refused_on_every_method(server):
    with server.http() as http:
        for origin in (EVIL, "null", "http://localhost.evil.example", "http://127.0.0.1.nip.io:8080"):
            json_post = http.post("/v1/chat/completions", content=BODY,
                                  headers={"Content-Type": "application/json", "Origin": origin})
            assert json_post.status_code == 403, origin
            assert http.get("/v1/models", headers={"Origin": origin}).status_code == 403, origin
        # A preflight from a foreign origin is CORS's to refuse, as before.
        pre = {"Origin": EVIL, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        assert http.options("/v1/chat/completions", headers=pre).status_code == 400


def test_json_from_local_pages_and_non_browsers_still_works(server):
    with server.http() as http:
        for headers in ({"Content-Type": "application/json"}, {"Content-Type": "Application/JSON; charset=utf-8"},
                        {"Content-Type": "application/json", "Origin": "http://localhost:3000"},
                        {"Content-Type": "application/json", "Origin": "http://127.0.0.1:5173"}):
            r = http.post("/v1/chat/completions", content=BODY, headers=headers)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2, (headers, r.text)
        assert http.get("/health").status_code == 200 and http.get("/v1/models").status_code == 200
    assert server.client().chat.completions.create(model="m", **json.loads(BODY)).choices[0].finish_reason
