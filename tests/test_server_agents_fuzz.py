"""Hostile bodies for /v1/messages, /v1/messages/count_tokens and /v1/responses: never a 5xx, a traceback or a path.

The same seeded approach as test_server_fuzz.py (raw JSON text, so lone surrogates and deep
nesting get through), with each API's own fields, and errors checked in each API's own shape.
"""

import json
import random

from test_server_fuzz import NESTED, SCALARS, STRINGS, VALUES, check, deep
from test_server_harness import server_fixture

ANY = VALUES + ['{"type":"text","text":"hi"}', '[{"type":"text","text":"hi"}]', '{"type":"auto"}', '{"x":1}']


def block(rng) -> str:
    kind = rng.choice(['"text"', '"thinking"', '"tool_use"', '"tool_result"', '"image"', '"redacted_thinking"', "1"])
    fields = {"type": kind}
    for key in rng.sample(["text", "thinking", "id", "name", "input", "tool_use_id", "content", "is_error"],
                          rng.choice([1, 2, 3])):
        fields[key] = rng.choice(ANY + ['"x"', '{"city":"Paris"}'])
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"


def turn(rng) -> str:
    role = rng.choice(['"user"', '"assistant"', '"x"'])
    content = rng.choice(STRINGS + ["[" + ",".join(block(rng) for _ in range(rng.choice([0, 1, 2]))) + "]"])
    return f'{{"role":{role},"content":{content}}}'


def anthropic_body(rng) -> str:
    fields = {"max_tokens": rng.choice(["2", "2", "2"] + SCALARS)}
    if rng.random() < 0.5:
        fields["messages"] = '[{"role":"user","content":"Hello"}]'
    else:
        turns = [turn(rng) for _ in range(rng.choice([0, 1, 2, 3]))]
        fields["messages"] = "[" + ",".join(turns) + "]"
    for name in rng.sample(["system", "temperature", "top_p", "top_k", "stop_sequences", "stream", "tools",
                            "tool_choice", "thinking", "metadata", "logit_bias", "seed"], rng.choice([0, 1, 2, 3])):
        fields[name] = rng.choice(ANY + ['[{"name":"f","input_schema":' + deep(80) + "}]",
                                         '{"type":"enabled","budget_tokens":1024}', '{"user_id":"u"}'])
    if rng.random() < 0.1:
        fields["messages"] = rng.choice(VALUES)
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"


def item(rng) -> str:
    kind = rng.choice(['"message"', '"function_call"', '"function_call_output"', '"reasoning"', '"input_image"',
                       "null", "3"])
    fields = {"type": kind}
    for key in rng.sample(["role", "content", "call_id", "name", "arguments", "output", "summary"],
                          rng.choice([1, 2, 3])):
        fields[key] = rng.choice(ANY + ['"user"', '"assistant"', '[{"type":"input_text","text":"hi"}]'])
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"


def responses_body(rng) -> str:
    fields = {"max_output_tokens": rng.choice(["2", "2"] + SCALARS)}
    if rng.random() < 0.4:
        fields["input"] = rng.choice(['"Hello"', '[{"role":"user","content":"Hello"}]'])
    else:
        fields["input"] = "[" + ",".join(item(rng) for _ in range(rng.choice([0, 1, 2, 3]))) + "]"
    for name in rng.sample(["instructions", "temperature", "top_p", "stream", "tools", "tool_choice", "store",
                            "previous_response_id", "reasoning", "text", "include", "truncation", "background",
                            "logit_bias", "seed"], rng.choice([0, 1, 2, 3])):
        fields[name] = rng.choice(ANY + NESTED + ['[{"type":"function","name":"f","parameters":' + deep(80) + "}]",
                                                  '{"effort":"none"}', '{"format":{"type":"text"}}'])
    if rng.random() < 0.1:
        fields["input"] = rng.choice(VALUES)
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"


server = server_fixture(request_timeout=1.0)


def test_fuzz_the_agent_apis(server):
    rng = random.Random(17)
    statuses = []
    with server.http() as http:
        for _ in range(120):
            path = rng.choice(["/v1/messages", "/v1/messages/count_tokens"])
            statuses.append(check(http, path, anthropic_body(rng)))
            statuses.append(check(http, "/v1/responses", responses_body(rng)))
    assert statuses.count(200) >= 10 and statuses.count(400) >= 100  # the fuzz reaches both sides
    with server.http() as http:  # and the server still answers
        ok = http.post("/v1/messages", json={"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        assert ok.status_code == 200 and json.loads(ok.text)["type"] == "message"
