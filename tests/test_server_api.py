"""The OpenAI surface, driven by the real `openai` package (sync and async) and raw HTTP."""

import asyncio
import json
import shutil

import openai
import pytest

import mlx_spec
from test_server_harness import EOS_BIAS, play_back, script, serve, sse_events

HELLO = [{"role": "user", "content": "Hello, how are you"}]


@pytest.fixture(scope="module")
def server(target_dir, drafter_dir):
    # A fixed block: the stats below must show drafts on any machine (the adaptive controller may stay plain).
    s = serve(target_dir, drafter_dir, block_size=4, max_active=4, keepalive_interval=0.5)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def library(target_dir, drafter_dir):
    return mlx_spec.load(target_dir, drafter=drafter_dir)


def test_health_and_models(server):
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.state.info.id]


def test_chat_matches_the_library_and_reports_stats(server, library):
    r = server.client().chat.completions.create(model="anything", messages=HELLO, max_tokens=12)
    model, tok = library
    assert r.choices[0].message.content == mlx_spec.generate(model, tok, HELLO, 12)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    spec = r.model_extra["speculative"]
    assert spec["drafted"] > 0 and spec["accepted"] >= 0 and spec["tau"] >= 1.0


def test_text_parts_and_max_completion_tokens(server):
    c = server.client()
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello, how are you"}]}]
    a = c.chat.completions.create(model="m", messages=parts, max_tokens=50, max_completion_tokens=6)
    b = c.chat.completions.create(model="m", messages=HELLO, max_tokens=6)
    assert a.usage.completion_tokens == 6
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stream_order_with_usage(server):
    body = {"messages": HELLO, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in sse_events(r.iter_lines()) if e != ":"]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    *content, finish, usage, done = events[1:]
    assert all(e["choices"][0]["finish_reason"] is None and "content" in e["choices"][0]["delta"] for e in content)
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"] and "tau" in usage["speculative"]
    assert done == "[DONE]"


def test_stream_without_stream_options_has_no_usage_chunk(server):
    chunks = list(server.client().chat.completions.create(model="m", messages=HELLO, max_tokens=5, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices and c.usage is None for c in chunks)
    with server.http() as http:  # stream_options present but without include_usage
        body = {"messages": HELLO, "max_tokens": 3, "stream": True, "stream_options": {}}
        events = sse_events(http.post("/v1/chat/completions", json=body).text.splitlines())
    assert events[-1] == "[DONE]" and all(e == "[DONE]" or e["choices"] for e in events)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    whole = server.client().chat.completions.create(model="m", messages=HELLO, max_tokens=5)
    assert streamed == whole.choices[0].message.content


def test_completions_text_and_token_ids(server):
    c = server.client()
    a = c.completions.create(model="m", prompt="def add(a, b):", max_tokens=7)
    ids = server.state.tokenizer.encode("def add(a, b):")
    b = c.completions.create(model="m", prompt=ids, max_tokens=7)
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 7
    chunks = list(c.completions.create(model="m", prompt="def add(a, b):", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == a.choices[0].text
    assert chunks[-1].usage.completion_tokens == 7


def test_default_completion_length_is_16(server):
    r = server.client().completions.create(model="m", prompt="Hello", extra_body={"logit_bias": EOS_BIAS})
    assert r.usage.completion_tokens == 16


def test_unprefixed_paths(server):
    with server.http() as http:
        assert http.get("/models").status_code == 200
        r = http.post("/chat/completions", json={"messages": HELLO, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        assert http.post("/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_many_stop_strings(server):
    c = server.client()
    full = c.chat.completions.create(model="m", messages=HELLO, max_tokens=30,
                                     logit_bias=EOS_BIAS).choices[0].message.content
    stop = full[len(full) // 2:][:2]
    junk = [f"<never-{i}>" for i in range(9)]
    r = c.chat.completions.create(model="m", messages=HELLO, max_tokens=30, logit_bias=EOS_BIAS, stop=junk + [stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.find(stop)]


def test_seeded_sampling_is_reproducible(server):
    c = server.client()
    kw = dict(model="m", messages=HELLO, max_tokens=10, temperature=1.0, top_p=0.95, seed=1234,
              presence_penalty=0.5, frequency_penalty=0.2, extra_body={"top_k": 50, "min_p": 0.01})
    assert c.chat.completions.create(**kw).choices[0].message.content == \
        c.chat.completions.create(**kw).choices[0].message.content


def test_concurrent_requests_equal_their_solo_outputs(server):
    prompts = ["def add(a, b):", "Hello, how are you", "for i in range(10):", "class Stack:"]
    kws = [dict(max_tokens=14 + 3 * i, **({"temperature": 0.9, "seed": 7 + i} if i % 2 else {}))
           for i in range(len(prompts))]

    async def one(c, p, kw, stream):
        msgs = [{"role": "user", "content": p}]
        if not stream:
            return (await c.chat.completions.create(model="m", messages=msgs, **kw)).choices[0].message.content
        out = []
        async for ch in await c.chat.completions.create(model="m", messages=msgs, stream=True, **kw):
            out.append(ch.choices[0].delta.content or "")
        return "".join(out)

    async def main():
        async with server.async_client() as c:
            solo = [await one(c, p, kw, False) for p, kw in zip(prompts, kws)]
            together = await asyncio.gather(*(one(c, p, kw, i % 2 == 0) for i, (p, kw) in enumerate(zip(prompts, kws))))
        return solo, together

    solo, together = asyncio.run(main())
    assert together == solo


def test_multi_turn_reuses_the_prefix_losslessly(server, library):
    c = server.client()
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]
    r1 = c.chat.completions.create(model="m", messages=turn1, max_tokens=8)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "Hello, how are you"}]
    r2 = c.chat.completions.create(model="m", messages=turn2, max_tokens=8)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1
    model, tok = library
    assert r2.choices[0].message.content == mlx_spec.generate(model, tok, turn2, 8)


def test_tools_are_accepted(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    r = server.client().chat.completions.create(model="m", messages=HELLO, tools=tools, tool_choice="auto", max_tokens=4)
    assert r.choices[0].finish_reason in ("length", "stop") and r.choices[0].message.tool_calls is None


def test_errors_are_openai_shaped_400s(server):
    c = server.client()
    cases = [
        dict(messages=HELLO, temperature="hot"),
        dict(messages=[]),
        dict(messages=HELLO, max_tokens=0),
        dict(messages=HELLO, max_tokens=10**12),
        dict(messages=HELLO, n=2),
        dict(messages=HELLO, logprobs=True),
        dict(messages=HELLO, tool_choice="required", tools=[{"type": "function", "function": {"name": "f"}}]),
        dict(messages=HELLO, logit_bias={"99999": 1}),
        dict(messages=[{"role": "wizard", "content": "x"}]),
    ]
    for body in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", **body)
        err = e.value.body
        assert e.value.status_code == 400 and set(err) >= {"message", "type", "param", "code"}, body
        assert err["type"] == "invalid_request_error"


def test_bad_token_ids(server):
    for prompt in ([1, 99999], [-1], [[5, 2**40]], [1.5]):
        with pytest.raises(openai.BadRequestError) as e:
            server.client().completions.create(model="m", prompt=prompt, max_tokens=2)
        assert e.value.body["param"].startswith("prompt"), prompt


def test_context_overflow(server):
    long = [{"role": "user", "content": "def add(a, b): return a + b\n" * 200}]
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="m", messages=long)
    err = e.value.body
    assert err["code"] == "context_length_exceeded"
    assert err["n_ctx"] == server.state.info.context_length and err["n_prompt_tokens"] > err["n_ctx"]


def test_not_found_and_wrong_method(server):
    with server.http() as http:
        r = http.get("/v1/nope")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert http.get("/v1/chat/completions").status_code == 405


def test_metrics(server):
    server.client().chat.completions.create(model="m", messages=HELLO, max_tokens=4)
    with server.http() as http:
        text = http.get("/metrics").text
    for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total",
                 "e2e_request_latency_seconds_bucket", "time_to_first_token_seconds_count",
                 "request_generation_tokens_per_second_sum", "generation_tokens_total", "num_requests_running"):
        assert f"mlx_spec:{name}{{" in text, name
    assert server.metric("spec_decode_num_draft_tokens_total") > 0
    assert server.metric("request_success_total", finished_reason="length") > 0


@pytest.fixture()
def tool_server(tmp_path, target_dir, monkeypatch):
    """A model whose tokenizer declares Hermes-style tool calls, generating a scripted reply."""
    model_dir = tmp_path / "tool-model"
    shutil.copytree(target_dir, model_dir)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "tool_parser_type": "json_tools"}))
    pieces = ["Let me check. <tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']

    play_back(monkeypatch, script(pieces))
    s = serve(model_dir)
    yield s
    s.stop()


def test_tool_calls_whole_and_streamed(tool_server):
    c = tool_server.client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = c.chat.completions.create(model="m", messages=HELLO, tools=tools)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content == "Let me check. "
    assert msg.tool_calls[0].function.name == "get_weather"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Paris"}
    chunks = list(c.chat.completions.create(model="m", messages=HELLO, tools=tools, stream=True))
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    # As OpenAI streams a call: index, id and name first with empty arguments, then the arguments.
    assert [(tc.index, tc.function.name, bool(tc.id)) for tc in calls] == [(0, "get_weather", True), (0, None, False)]
    assert json.loads("".join(tc.function.arguments for tc in calls)) == {"city": "Paris"}
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Let me check. "
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = c.chat.completions.create(model="m", messages=HELLO)  # no tools offered: the text as it is
    assert "<tool_call>" in plain.choices[0].message.content and plain.choices[0].message.tool_calls is None


def test_failure_mid_stream_is_an_error_event(tmp_path, target_dir, monkeypatch):
    def failing(ids):
        yield mlx_spec.GenerationResponse(text="partial", token=1, tokens=[1], prompt_tokens=len(ids), prompt_tps=0.0,
                                          generation_tokens=1, generation_tps=0.0, peak_memory=0.0)
        raise RuntimeError("boom")

    play_back(monkeypatch, failing)
    s = serve(target_dir)
    try:
        with s.http() as http, http.stream("POST", "/v1/chat/completions", json={"messages": HELLO, "stream": True}) as r:
            events = [e for e in sse_events(r.iter_lines()) if e != ":"]
        assert events[1]["choices"][0]["delta"]["content"] == "partial"
        assert events[-1]["error"]["code"] == "internal_error" and len(events) == 3  # no finish chunk, no [DONE]
        with pytest.raises(openai.APIError):
            list(s.client().chat.completions.create(model="m", messages=HELLO, stream=True))
        # (the worker records the failure as it ends the request, just after the client has read the error)
        assert s.wait_for(lambda: s.metric("request_success_total", finished_reason="error") == 2)
        assert s.client().models.list().data  # still serving
    finally:
        s.stop()


def test_a_failing_step_does_not_wedge_the_worker(server, monkeypatch):
    from mlx_spec.app.server.metrics import Metrics

    def broken(self, seq):
        raise RuntimeError("bug")

    monkeypatch.setattr(Metrics, "record", broken)
    c = server.client()
    assert c.chat.completions.create(model="m", messages=HELLO, max_tokens=2).usage.completion_tokens == 2
    assert c.chat.completions.create(model="m", messages=HELLO, max_tokens=2).usage.completion_tokens == 2
    assert server.state.scheduler._thread.is_alive()
