"""Server pieces without a server: tool-call parsing, the prefix-cache pool, request params, gates, templates."""

import json
import shutil

import pytest

import mlx_spec
from mlx_lm.tool_parsers import json_tools, mistral

from mlx_spec.app.server.backend import ModelInfo
from mlx_spec.app.server.config import Defaults, ServerConfig
from mlx_spec.app.server.errors import APIError
from mlx_spec.app.server.params import chat_job, check_chat, completion_job
from mlx_spec.app.server.prefix_cache import PrefixCachePool
from mlx_spec.app.server.prompt import PromptBuilder
from mlx_spec.app.server.schemas import ChatRequest, CompletionRequest
from mlx_spec.app.server.security import hostname
from mlx_spec.app.server.tools import ToolCallFilter

INFO = ModelInfo(id="m", context_length=100, vocab_size=50, speculative=False, block_size=None)
LIMITS = ServerConfig()


def feed_in_pieces(f: ToolCallFilter, text: str, size: int):
    shown, calls = "", []
    for i in range(0, len(text), size):
        t, c = f.feed(text[i:i + size])
        shown, calls = shown + t, calls + c
    t, c = f.feed("", final=True)
    return shown + t, calls + c


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_hermes_tool_calls_stream_in_any_pieces(size):
    text = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            '<tool_call>{"name": "now", "arguments": {}}</tool_call> <tool_ca')
    f = ToolCallFilter(json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call, [])
    shown, calls = feed_in_pieces(f, text, size)
    assert shown == "Sure.  <tool_ca"
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(0, "get_weather", {"city": "Paris"}), (1, "now", {})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_broken_tool_call_is_shown_as_text():
    f = ToolCallFilter("<tool_call>", "</tool_call>", json_tools.parse_tool_call, [])
    assert feed_in_pieces(f, "a<tool_call>{not json</tool_call>b", 4) == ("a<tool_call>{not json</tool_call>b", [])


def test_mistral_tool_calls_run_to_the_end():
    f = ToolCallFilter(mistral.tool_call_start, mistral.tool_call_end, mistral.parse_tool_call, [])
    shown, calls = feed_in_pieces(f, 'ok[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', 5)
    assert shown == "ok" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


class FakeCache(mlx_spec.PromptCache):
    def __init__(self, tokens):  # only the tokens: what the pool ranks caches by
        self.tokens = tokens


def test_prefix_pool_picks_the_longest_shared_prefix_and_never_shares():
    made = []
    pool = PrefixCachePool(lambda: made.append(FakeCache([])) or made[-1], capacity=2)
    a, b = FakeCache([1, 2, 3, 4]), FakeCache([1, 2, 9])
    pool.release(a)
    pool.release(b)
    assert pool.acquire([1, 2, 3, 4, 5]) is a
    assert pool.acquire([1, 2, 3, 4, 5]) is b  # a is taken; b shares [1, 2]
    assert pool.acquire([7]) is made[0]  # nothing idle: a fresh one
    pool.release(a)
    pool.release(b)
    pool.release(FakeCache([5]))  # over capacity: the least recently used (a) goes
    assert a not in pool.idle.values() and len(pool.idle) == 2
    assert pool.acquire([8]) is b  # full and no shared prefix: recycle the oldest


def req(**kw) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def test_params_mapping():
    job = chat_job(req(max_tokens=5, max_completion_tokens=7, top_k=-1, seed=-1, stop="x",
                       presence_penalty=0, logit_bias={"3": -100}), [1, 2, 3], INFO, Defaults(), LIMITS)
    assert job.max_tokens == 7 and job.stop == ["x"]
    s = job.sampling
    assert s.top_k == 0 and s.seed == (1 << 64) - 1 and s.presence_penalty is None and s.logit_bias == {3: -100.0}
    assert chat_job(req(), [1] * 90, INFO, Defaults(), LIMITS).max_tokens == 10  # up to the context end
    assert chat_job(req(max_tokens=50), [1] * 90, INFO, Defaults(), LIMITS).max_tokens == 10


def test_completions_are_raw_text_and_chats_are_chat():
    """Each kind starts from its own acceptance estimates (controller.ControllerMemory.by_kind)."""
    raw = CompletionRequest.model_validate({"prompt": "def f("})
    assert completion_job(raw, [1, 2], INFO, Defaults(), LIMITS).kind == "raw"
    assert chat_job(req(), [1, 2], INFO, Defaults(), LIMITS).kind == "chat"


@pytest.mark.parametrize("kw", [dict(n=3), dict(logprobs=True), dict(top_logprobs=2),
                                dict(response_format={"type": "json_object"}),
                                dict(tool_choice={"type": "function", "function": {"name": "f"}})])
def test_refused_fields(kw):
    with pytest.raises(APIError) as e:
        check_chat(req(**kw), LIMITS)
    assert e.value.status == 400 and e.value.param


def test_context_overflow_error_carries_sizes():
    with pytest.raises(APIError) as e:
        chat_job(req(), [1] * 100, INFO, Defaults(), LIMITS)
    assert e.value.code == "context_length_exceeded" and e.value.extra == {"n_prompt_tokens": 100, "n_ctx": 100}


def test_hostname():
    assert [hostname(h) for h in ["LocalHost:8080", "127.0.0.1", "[::1]:80", "::1", "a.b"]] == \
        ["localhost", "127.0.0.1", "::1", "::1", "a.b"]


def test_chat_template_is_sandboxed(tmp_path, target_dir):
    from mlx_lm.utils import load_tokenizer

    marker = tmp_path / "pwned"
    evil = ("{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
            "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    tok_dir = tmp_path / "tok"
    shutil.copytree(target_dir, tok_dir)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": evil}))
    builder = PromptBuilder(load_tokenizer(tok_dir), INFO)
    with pytest.raises(APIError) as e:
        builder.chat(req().messages, None)
    assert e.value.status == 400 and not marker.exists()
