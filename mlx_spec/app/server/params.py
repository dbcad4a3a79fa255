"""Request fields to a generation `Job`: token limits, sampling, stops, and the fields we refuse.

A refused field is a 400 with a clear message rather than silently ignored, so that a
client never gets an answer computed differently from what it asked for.
"""

from __future__ import annotations

from mlx_spec import MlxSpecError, SamplingParams

from .backend import ModelInfo
from .config import Defaults
from .errors import APIError, invalid
from .schemas import ChatRequest, CompletionRequest, Sampling
from .sequence import Job


def check_chat(req: ChatRequest, limits) -> None:
    """Cheap checks, before the prompt is tokenized."""
    if req.logprobs or req.top_logprobs:
        raise invalid("logprobs are not supported yet", "logprobs")
    if req.response_format is not None and req.response_format.type != "text":
        raise invalid(f"response_format {req.response_format.type!r} is not supported (no constrained decoding)",
                      "response_format")
    if req.tool_choice == "required" or not isinstance(req.tool_choice, (str, type(None))):
        raise invalid("forcing a tool call is not supported (no constrained decoding); use 'auto'", "tool_choice")
    if len(req.messages) > limits.max_messages:
        raise invalid(f"at most {limits.max_messages} messages per request", "messages")
    if req.tools and len(req.tools) > limits.max_tools:
        raise invalid(f"at most {limits.max_tools} tools per request", "tools")
    _check_n(req)


TEMPLATE_KWARGS = ("enable_thinking",)  # template variables a request may set; others could break templates


def template_kwargs(given: dict | None, param: str = "chat_template_kwargs") -> dict:
    """The template variables of `chat_template_kwargs`; a name we do not pass on is a 400, not ignored."""
    given = given or {}
    unknown = [k for k in given if k not in TEMPLATE_KWARGS]
    if unknown:
        raise invalid(f"{param}: only {', '.join(TEMPLATE_KWARGS)} may be set, not {unknown[0][:64]!r}", param)
    if "enable_thinking" in given and not isinstance(given["enable_thinking"], bool):
        raise invalid(f"{param}.enable_thinking must be true or false", param)
    return dict(given)


def check_prompt_chars(chars: int, info: ModelInfo, param: str) -> None:
    """Refuse a prompt that cannot fit by its length in characters alone, before paying to tokenize it."""
    bound = info.max_prompt_chars
    if bound is not None and chars > bound:
        ctx = info.context_length
        raise APIError(400, f"This model's maximum context length is {ctx} tokens, and a prompt of {chars} "
                       f"characters is longer than any {ctx}-token text ({bound} characters). Shorten the "
                       "messages or the prompt.", code="context_length_exceeded", param=param, extra={"n_ctx": ctx})


def chat_job(req: ChatRequest, ids: list[int], info: ModelInfo, defaults: Defaults, limits,
             partition: tuple = ()) -> Job:
    wanted = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    return _job(req, ids, wanted, param, "messages", info, defaults, limits, partition)


def job(req: Sampling, ids: list[int], wanted: int | None, param: str, prompt_param: str, info: ModelInfo,
        defaults: Defaults, limits, partition: tuple = ()) -> Job:
    """A job for the Messages and Responses APIs, whose own fields were mapped onto `req`."""
    return _job(req, ids, wanted, param, prompt_param, info, defaults, limits, partition)


def check_counts(messages: int, tools: int, limits) -> None:
    if messages > limits.max_messages:
        raise invalid(f"at most {limits.max_messages} messages per request", "messages")
    if tools > limits.max_tools:
        raise invalid(f"at most {limits.max_tools} tools per request", "tools")


def check_completion(req: CompletionRequest) -> None:
    unsupported = [("logprobs", req.logprobs is not None), ("echo", bool(req.echo)),
                   ("best_of", req.best_of not in (None, 1)), ("suffix", bool(req.suffix))]
    for name, bad in unsupported:
        if bad:
            raise invalid(f"{name} is not supported yet", name)
    _check_n(req)


def _check_n(req: Sampling) -> None:
    if req.n != 1:
        raise invalid("only n=1 is supported", "n")


def completion_job(req: CompletionRequest, ids: list[int], info: ModelInfo, defaults: Defaults, limits,
                   partition: tuple = ()) -> Job:
    wanted = req.max_tokens if req.max_tokens is not None else (defaults.max_tokens or 16)
    return _job(req, ids, wanted, "max_tokens", "prompt", info, defaults, limits, partition, kind="raw")


def _job(req: Sampling, ids, wanted, param, prompt_param, info: ModelInfo, defaults: Defaults, limits,
         partition: tuple, kind: str = "chat") -> Job:
    ctx = info.context_length
    if not ids:
        raise invalid("the prompt is empty", prompt_param)
    if len(ids) >= ctx:
        raise APIError(400, f"This model's maximum context length is {ctx} tokens, but the prompt has {len(ids)} "
                       "tokens. Shorten the messages or the prompt.", code="context_length_exceeded",
                       param=prompt_param, extra={"n_prompt_tokens": len(ids), "n_ctx": ctx})
    if wanted is None:
        wanted = defaults.max_tokens or ctx
    if not 1 <= wanted <= ctx:
        raise invalid(f"{param} must be between 1 and the context length {ctx}, got {wanted}", param)
    # Like the library (and llama.cpp, Ollama), a limit past the context end stops at the end.
    return Job(list(ids), min(wanted, ctx - len(ids)), _sampling(req, info, defaults.sampling),
               _stops(req.stop, defaults.stop, limits), partition, kind)


MIN_REPETITION_PENALTY = 0.01  # logits / penalty: smaller values overflow float32 (0 and below mean nothing)


def _sampling(req: Sampling, info: ModelInfo, base: SamplingParams) -> SamplingParams:
    # Tiny temperatures and top_p are fine here: the library's Sampler treats them as greedy / top-1.
    if req.repetition_penalty is not None and req.repetition_penalty < MIN_REPETITION_PENALTY:
        raise invalid(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 10] (1 means off), "
                      f"got {req.repetition_penalty}", "repetition_penalty")
    given = {k: getattr(req, k) for k in ("temperature", "top_p", "min_p", "repetition_penalty")
             if getattr(req, k) is not None}
    if req.top_k is not None:
        given["top_k"] = max(0, min(req.top_k, info.vocab_size))
    for k in ("presence_penalty", "frequency_penalty"):
        if getattr(req, k) is not None:
            given[k] = getattr(req, k) or None  # 0 means off; skipping the processor keeps rounds fast
    if req.seed is not None:
        given["seed"] = req.seed % (1 << 64)
    if req.logit_bias:
        given["logit_bias"] = _logit_bias(req.logit_bias, info.vocab_size)
    try:
        return SamplingParams(**{**base.__dict__, **given})
    except MlxSpecError as e:
        raise invalid(str(e)) from None


def _logit_bias(bias: dict[str, float], vocab: int) -> dict[int, float]:
    if len(bias) > 1024:
        raise invalid("logit_bias may have at most 1024 entries", "logit_bias")
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab:
            raise invalid(f"logit_bias token id {token} is outside the vocabulary [0, {vocab})", "logit_bias")
        if not -100 <= value <= 100:
            raise invalid("logit_bias values must be in [-100, 100]", "logit_bias")
        out[token] = float(value)
    return out


def _stops(stop, default: tuple[str, ...], limits) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop) if stop is not None else list(default)
    if len(stops) > limits.max_stop:
        raise invalid(f"at most {limits.max_stop} stop sequences", "stop")
    if any(len(s) > limits.max_stop_chars for s in stops):
        raise invalid(f"stop sequences must be at most {limits.max_stop_chars} characters", "stop")
    return [s for s in stops if s]
