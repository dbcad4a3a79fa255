"""Sampling values at the edge of float32: tiny temperatures and top_p are greedy, a non-positive penalty is a 400."""

import pytest

import mlx_spec
from test_server_harness import EOS_BIAS, plain_library_fixture, server_fixture

HELLO = [{"role": "user", "content": "Hello, how are you"}]
TINY = [1e-50, 5e-324, 1e-30, 9e-6]


server = server_fixture()
library = plain_library_fixture()


def test_tiny_temperatures_and_top_p_give_exactly_the_greedy_reply(server):
    c = server.client()

    def reply(**kw):
        r = c.chat.completions.create(model="m", messages=HELLO, max_tokens=24, logit_bias=EOS_BIAS, **kw)
        return r.choices[0].message.content

    greedy = reply(temperature=0)
    for t in TINY:
        assert reply(temperature=t) == greedy, t
        assert reply(temperature=t, seed=7) == greedy, t
    for p in (1e-50, 5e-324, 1e-9):  # keeps only the most likely token, whatever the temperature
        assert reply(temperature=1.0, top_p=p, seed=3) == greedy, p
        assert reply(temperature=1.5, top_p=p) == greedy, p


def test_the_library_and_cli_get_the_same_threshold(library):
    model, tok = library
    greedy = mlx_spec.generate(model, tok, "def add", 16, logit_bias={0: -100, 2: -100})
    for t in TINY:
        assert mlx_spec.generate(model, tok, "def add", 16, temperature=t, logit_bias={0: -100, 2: -100}) == greedy
    assert mlx_spec.generate(model, tok, "def add", 16, temperature=1.0, top_p=1e-50, seed=1,
                             logit_bias={0: -100, 2: -100}) == greedy


@pytest.mark.parametrize("penalty", [0, -1, -1e-9, 1e-50, 5e-324, 0.001])
def test_repetition_penalty_at_or_near_zero_is_a_400(server, penalty):
    with server.http() as http:
        r = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, "repetition_penalty": penalty})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty", r.text
    ok = server.client().chat.completions.create(model="m", messages=HELLO, max_tokens=2,
                                                 extra_body={"repetition_penalty": 1.1})
    assert ok.usage.completion_tokens >= 1
