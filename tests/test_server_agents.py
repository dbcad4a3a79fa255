"""Anthropic Messages and OpenAI Responses, driven by the real `anthropic` and `openai` clients and raw HTTP."""

import json

import anthropic
import openai
import pytest

from test_server_agent_models import OPEN_THINKING_TEMPLATE, THINKING_TEMPLATE, play_back, with_template
from test_server_harness import EOS_BIAS, serve

HELLO = [{"role": "user", "content": "Hello, how are you"}]
BIAS = {"logit_bias": EOS_BIAS}  # mlx-spec's extension field: keeps the random model from stopping early
TOOLS = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
RTOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
CONVERSATION = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
                {"role": "user", "content": "print the sum"}]
SYSTEM = "You are terse."


def claude(server, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=60,
                               **kw)


def named_events(lines) -> list[tuple[str, dict]]:
    """SSE lines to (event name, data) pairs."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: "):])))
    return out


@pytest.fixture(scope="module")
def server(target_dir, drafter_dir):
    s = serve(target_dir, drafter_dir, max_active=4, keepalive_interval=0.5)
    yield s
    s.stop()


def test_messages_create_and_stream(server):
    c = claude(server)
    r = c.messages.create(model="m", max_tokens=8, messages=HELLO, system=SYSTEM, extra_body=BIAS)
    assert r.type == "message" and r.role == "assistant" and r.stop_reason == "max_tokens"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.usage.output_tokens == 8 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 0
    assert r.model_extra["speculative"]["rounds"] >= 1 and "tau" in r.model_extra["speculative"]
    with c.messages.stream(model="m", max_tokens=8, messages=HELLO, system=SYSTEM, extra_body=BIAS) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == r.content[0].text == final.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8
    body = {"model": "m", "max_tokens": 4, "messages": HELLO, "stream": True, **BIAS}
    with server.http() as http, http.stream("POST", "/v1/messages", json=body) as resp:
        events = named_events(resp.iter_lines())
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[1] == "content_block_start" and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and all(n == d["type"] for n, d in events)
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 4
    assert "tau" in delta["speculative"]


def test_responses_create_and_stream(server):
    c = server.client()
    r = c.responses.create(model="m", input="Hello, how are you", instructions=SYSTEM, max_output_tokens=8,
                           extra_body=BIAS)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 8 and r.store is False
    assert r.model_extra["speculative"]["rounds"] >= 1 and "accepted" in r.model_extra["speculative"]
    events = list(c.responses.create(model="m", input="Hello, how are you", instructions=SYSTEM,
                                     max_output_tokens=8, stream=True, extra_body=BIAS))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    done = c.responses.create(model="m", input=[{"role": "user", "content": "Hello"}], max_output_tokens=64)
    assert done.status == "completed" or done.usage.output_tokens == 64  # EOS allowed: may finish


def test_greedy_text_is_the_same_in_all_three_apis(server):
    chat = server.client().chat.completions.create(
        model="m", messages=[{"role": "system", "content": SYSTEM}, *CONVERSATION], max_tokens=10, **{"extra_body": BIAS})
    msg = claude(server).messages.create(model="m", system=[{"type": "text", "text": SYSTEM}], max_tokens=10,
                                         messages=[{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                                                   for m in CONVERSATION], extra_body=BIAS)
    resp = server.client().responses.create(model="m", instructions=SYSTEM, max_output_tokens=10, extra_body=BIAS,
                                            input=[{"role": m["role"], "content": m["content"]} for m in CONVERSATION])
    assert chat.choices[0].message.content == msg.content[0].text == resp.output_text
    assert chat.usage.prompt_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens == \
        resp.usage.input_tokens


def test_count_tokens_equals_usage(server):
    c = claude(server)
    kw = dict(model="m", system=SYSTEM, messages=CONVERSATION)
    counted = c.messages.count_tokens(**kw).input_tokens
    r = c.messages.create(max_tokens=2, **kw)
    assert counted == r.usage.input_tokens + r.usage.cache_read_input_tokens > 0
    assert claude(server).messages.count_tokens(model="m", messages=HELLO).input_tokens < counted


def test_errors_take_each_apis_shape(server):
    c = claude(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=0, messages=HELLO)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    for bad in [dict(tool_choice={"type": "any"}, tools=TOOLS), dict(tools=[{"type": "web_search_20250305",
                                                                              "name": "web_search"}]),
                dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])]:
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(**{"model": "m", "max_tokens": 4, "messages": HELLO, **bad})
        assert set(e.value.body) == {"type", "error"} and set(e.value.body["error"]) == {"type", "message"}
    with server.http() as http:
        r = http.post("/v1/messages", json={"model": "m", "messages": HELLO})  # max_tokens is required
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        r = http.post("/v1/messages", json={"max_tokens": 4, "messages": [{"role": "user", "content": "x" * 10**6}]})
        assert r.status_code == 400 and r.json()["type"] == "error"
        r = http.post("/v1/messages/nope", json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = http.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_1"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    o = server.client()
    for bad in [dict(tool_choice="required", tools=RTOOLS), dict(tools=[{"type": "web_search"}]),
                dict(input=[{"type": "input_image", "image_url": "x"}]), dict(text={"format": {"type": "json_schema"}})]:
        with pytest.raises(openai.BadRequestError) as e:
            o.responses.create(**{"model": "m", "input": "hi", **bad})
        assert set(e.value.body) >= {"message", "type", "param", "code"}


def test_host_origin_and_content_type_gates(server):
    with server.http() as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
            body = {"max_tokens": 2, "messages": HELLO, "input": "hi"}
            r = http.post(path, json=body, headers={"Host": "evil.example"})
            assert r.status_code == 403
            r = http.post(path, json=body, headers={"Origin": "https://evil.example"})
            assert r.status_code == 403
            r = http.post(path, content=json.dumps(body), headers={"Content-Type": "text/plain"})
            assert r.status_code == 415
            shape = r.json()
            assert (shape["type"] == "error") if "messages" in path else ("param" in shape["error"])
            r = http.options(path, headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
            assert r.headers["access-control-allow-origin"] == "http://localhost:3000"


@pytest.fixture(scope="module")
def keyed(long_target_dir):
    s = serve(long_target_dir, api_keys=("secret-key-1",), max_body_bytes=64 << 10, max_active=1, max_queue=0,
              keepalive_interval=0.1)
    yield s
    s.stop()


def test_api_keys_as_anthropic_clients_send_them(keyed):
    for kw in ({"api_key": "secret-key-1"}, {"api_key": None, "auth_token": "secret-key-1"}):  # x-api-key, Bearer
        assert claude(keyed, **kw).messages.create(model="m", max_tokens=2, messages=HELLO).content is not None
    with pytest.raises(anthropic.AuthenticationError) as e:
        claude(keyed, api_key="wrong-key-0").messages.create(model="m", max_tokens=2, messages=HELLO)
    assert e.value.body["error"]["type"] == "authentication_error"
    assert keyed.client(api_key="secret-key-1").responses.create(model="m", input="hi", max_output_tokens=2).output
    with pytest.raises(openai.AuthenticationError):
        keyed.client(api_key="wrong-key-0").responses.create(model="m", input="hi", max_output_tokens=2)


def test_body_limit_queue_limit_and_disconnect(keyed):
    c = claude(keyed, api_key="secret-key-1")
    with pytest.raises(anthropic.APIStatusError) as e:
        c.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x" * (70 << 10)}])
    assert e.value.status_code == 413 and e.value.body["error"]["type"] == "request_too_large"
    long = {"model": "m", "max_tokens": 3000, "messages": HELLO, "stream": True, **BIAS}
    headers = {"x-api-key": "secret-key-1"}
    for path, body in (("/v1/messages", long), ("/v1/responses", {"input": "hi", "max_output_tokens": 3000,
                                                                   "stream": True, **BIAS})):
        aborted = keyed.metric("request_success_total", finished_reason="abort")
        with keyed.http(headers=headers) as http, http.stream("POST", path, json=body) as r:
            lines = r.iter_lines()
            assert sum(line.startswith("data: ") for _, line in zip(range(40), lines)) >= 6
            assert keyed.wait_for(lambda: keyed.metric("num_requests_running") == 1)
            with keyed.http(headers=headers) as other:  # one slot, no queue: busy
                busy = other.post(path, json={**body, "stream": False})
            assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
            assert ("type" in busy.json()) == (path == "/v1/messages")
        # The client hung up: the generation stops and its slot is free long before 3000 tokens.
        assert keyed.wait_for(lambda: keyed.metric("request_success_total", finished_reason="abort") == aborted + 1)
        assert keyed.wait_for(lambda: keyed.metric("num_requests_running") == 0)


@pytest.fixture()
def agent(tmp_path, target_dir, monkeypatch):
    """A thinking, tool-calling template, replying with scripted thinking, text and a tool call."""
    play_back(monkeypatch, ["<think>\nThe user wants", " the weather.\n</think>\n\n", "Let me check. <tool",
                            '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>'])
    s = serve(with_template(target_dir, tmp_path / "agent", THINKING_TEMPLATE))
    yield s
    s.stop()


def test_reasoning_and_tool_calls_in_messages(agent):
    c = claude(agent)
    r = c.messages.create(model="m", max_tokens=50, messages=HELLO, tools=TOOLS)
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"] and r.stop_reason == "tool_use"
    assert r.content[0].thinking == "\nThe user wants the weather.\n" and r.content[1].text == "Let me check. "
    call = r.content[2]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    with c.messages.stream(model="m", max_tokens=50, messages=HELLO, tools=TOOLS) as s:
        events = list(s)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"] and final.content[2].input == {
        "city": "Paris"}
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
    # The next turn carries the tool_use and its tool_result (and the thinking) back.
    follow = [*HELLO, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"},
                                           {"type": "text", "text": "Thanks"}]}]
    assert c.messages.create(model="m", max_tokens=50, messages=follow, tools=TOOLS).stop_reason == "tool_use"
    assert c.messages.count_tokens(model="m", messages=follow, tools=TOOLS).input_tokens > \
        c.messages.count_tokens(model="m", messages=HELLO, tools=TOOLS).input_tokens
    plain = c.messages.create(model="m", max_tokens=50, messages=HELLO)  # no tools: the call stays text
    assert "<tool_call>" in plain.content[-1].text and plain.stop_reason == "end_turn"


def test_reasoning_and_tool_calls_in_responses(agent):
    c = agent.client()
    r = c.responses.create(model="m", input="Hello", tools=RTOOLS)
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call"] and r.status == "completed"
    assert r.output[0].content[0].text == "\nThe user wants the weather.\n" and r.output_text == "Let me check. "
    fc = r.output[2]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    events = list(c.responses.create(model="m", input="Hello", tools=RTOOLS, stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed" and [i.type for i in events[-1].response.output] == [
        "reasoning", "message", "function_call"]
    follow = ["Hello", *[i.model_dump(exclude_none=True) for i in r.output],
              {"type": "function_call_output", "call_id": fc.call_id, "output": "Sunny"}]
    follow[0] = {"role": "user", "content": "Hello"}
    assert c.responses.create(model="m", input=follow, tools=RTOOLS).output[-1].type == "function_call"


def test_reasoning_and_tool_call_deltas_in_chat(agent):
    c = agent.client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = c.chat.completions.create(model="m", messages=HELLO, tools=tools)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] == "\nThe user wants the weather.\n" and msg.content == "Let me check. "
    assert msg.tool_calls[0].function.name == "get_weather"
    chunks = list(c.chat.completions.create(model="m", messages=HELLO, tools=tools, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "\nThe user wants the weather.\n"
    assert "".join(d.content or "" for d in deltas) == "Let me check. "


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, target_dir):
    """The real random model under a template that opens the thinking block (as DeepSeek-R1's does)."""
    s = serve(with_template(target_dir, tmp_path_factory.mktemp("t") / "open", OPEN_THINKING_TEMPLATE, None))
    yield s
    s.stop()


def test_thinking_can_be_turned_off(thinker):
    c = thinker.client()
    # mlx-lm turns thinking on by default only for vocabularies with a <think> token; this one has none.
    on = c.chat.completions.create(model="m", messages=HELLO, max_tokens=6, extra_body={
        **BIAS, "chat_template_kwargs": {"enable_thinking": True}}).choices[0].message
    assert on.model_extra["reasoning_content"] and not on.content  # it never closes the block: all reasoning
    off = c.chat.completions.create(model="m", messages=HELLO, max_tokens=6,
                                    extra_body={**BIAS, "chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content and "reasoning_content" not in off.choices[0].message.model_extra
    m = claude(thinker).messages.create(model="m", max_tokens=6, messages=HELLO, extra_body=BIAS,
                                        thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == off.choices[0].message.content
    r = c.responses.create(model="m", input=HELLO, max_output_tokens=6, reasoning={"effort": "none"}, extra_body=BIAS)
    assert [i.type for i in r.output] == ["message"] and r.output_text == off.choices[0].message.content
    thought = claude(thinker).messages.create(model="m", max_tokens=6, messages=HELLO, extra_body=BIAS,
                                              thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in thought.content] == ["thinking"]
    assert thought.content[0].thinking == on.model_extra["reasoning_content"]
    r = c.responses.create(model="m", input=HELLO, max_output_tokens=6, reasoning={"effort": "low"}, extra_body=BIAS)
    assert [i.type for i in r.output] == ["reasoning"] and r.output[0].content[0].text == thought.content[0].thinking
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="m", messages=HELLO, extra_body={"chat_template_kwargs": {"tools": 1}})


def test_a_stop_sequence_is_reported_as_anthropic_does(server):
    c = claude(server)
    full = c.messages.create(model="m", max_tokens=12, messages=HELLO, extra_body=BIAS).content[0].text
    stop = full[3:6]
    assert stop and stop not in full[:3]
    r = c.messages.create(model="m", max_tokens=12, messages=HELLO, stop_sequences=["\x00never", stop], extra_body=BIAS)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop and r.content[0].text == full[:3]
    with c.messages.stream(model="m", max_tokens=12, messages=HELLO, stop_sequences=[stop], extra_body=BIAS) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
