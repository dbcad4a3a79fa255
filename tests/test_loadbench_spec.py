"""The server's speculation-under-load benchmark: its table, against two stand-in servers."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mlx_spec.app.server import loadbench_spec


def server(tokens: int):
    """A stand-in that answers after 0.2 s, as a real server takes a while: concurrent clients' requests are
    then all in flight at once (answered at once, a client could finish before the next one started, and
    the steady ratio had no span to measure)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            time.sleep(0.2)
            out = json.dumps({"usage": {"completion_tokens": tokens}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, seen


def against_stand_ins(args: list[str]):
    """The benchmark run with `args` against a speculative stand-in (8 tokens an answer) and a plain one (4):
    the request bodies each received, in order."""
    spec, spec_seen = server(8)
    plain, plain_seen = server(4)
    try:
        loadbench_spec.main(["--spec", f"http://127.0.0.1:{spec.server_port}", "--plain",
                             f"http://127.0.0.1:{plain.server_port}", "--repeats", "1", "--json", *args])
    finally:
        spec.shutdown()
        plain.shutdown()
    return spec_seen, plain_seen


def test_table_pairs_spec_and_plain_servers(capsys):
    spec_seen, plain_seen = against_stand_ins(["--clients", "1,3", "--per-client", "1", "--spec-pid", str(os.getpid()),
                                               "--plain-pid", str(os.getpid())])
    data = json.loads(capsys.readouterr().out)
    rows = data["results"]
    assert [(r["kind"], r["clients"]) for r in rows] == [("code", 1), ("code", 3), ("raw", 1), ("raw", 3)]
    assert all(r["spec_tps"] > 0 and r["plain_tps"] > 0 and len(r["ratios"]) == 1 for r in rows)
    assert all(r["spec_tokens_per_cpu_s"] >= 0 and "cpu_ratio" in r for r in rows)  # this process stands in for both
    assert all(r["steady_ratio"] > 0 and len(r["steady_ratios"]) == 1 for r in rows)
    paths = {p for p, _ in spec_seen}
    assert paths == {"/v1/chat/completions", "/v1/completions"} == {p for p, _ in plain_seen}
    raw = [b for p, b in spec_seen if p == "/v1/completions"]
    assert raw and all("prompt" in b and b["temperature"] == 0.0 for b in raw)  # raw text, no chat template


def test_steady_rate_counts_the_time_every_client_was_busy():
    """Client A: two requests of 10 tokens, 0-1 s and 1-2 s; client B: one of 30 tokens, 0-3 s. All busy from 0
    to 2 s: A's 20 tokens and two thirds of B's 30, 40 tokens in 2 s (the whole run: 50 in 3 s)."""
    assert loadbench_spec.steady_rate([[(0.0, 1.0, 10), (1.0, 2.0, 10)], [(0.0, 3.0, 30)]]) == 20.0
    assert loadbench_spec.steady_rate([[(0.0, 1.0, 10)], [(2.0, 3.0, 10)]]) is None  # never both busy


def test_a_server_that_fails_fails_the_benchmark():
    import socket

    import pytest

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit, match=str(port)):
        loadbench_spec.main(["--spec", f"http://127.0.0.1:{port}", "--plain", f"http://127.0.0.1:{port}",
                             "--clients", "1", "--repeats", "1", "--per-client", "1"])


def test_varied_answer_lengths_average_max_tokens_and_are_the_same_for_both_servers(capsys):
    spec_seen, plain_seen = against_stand_ins(["--clients", "3", "--per-client", "2", "--kinds", "raw",
                                               "--max-tokens", "64", "--vary-tokens"])
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings == {"max_tokens": 64, "vary_tokens": True, "per_client": 2, "repeats": 1, "logit_bias": "{}"}
    asked = [sorted((b["prompt"], b["max_tokens"]) for _, b in seen[2:]) for seen in (spec_seen, plain_seen)]  # after warm-up
    assert asked[0] == asked[1] and len(asked[0]) == 6
    assert sorted(n for _, n in asked[0]) == [40, 40, 64, 64, 88, 88]  # each client: two of the three lengths
    assert {b["max_tokens"] for _, b in spec_seen[:2]} == {40, 64}  # the warm-up's two clients vary too
