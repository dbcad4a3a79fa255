"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens (Claude Code, agent SDKs).

A request becomes the same chat messages and tools the Chat Completions endpoint renders, so
the same conversation gives the same prompt tokens and, greedy, the same text. Thinking comes
back as `thinking` blocks and tool calls as `tool_use` blocks. Errors take Anthropic's shape
(errors.py, by path). Streams send Anthropic's events with `event:` lines, which its clients
dispatch on: message_start, then per block content_block_start / _delta / _stop, message_delta
(stop_reason, usage), message_stop; `ping` while nothing else is sent.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field, ValidationError

from . import params
from .errors import invalid
from .handle import Handle
from .responses import speculative
from .routes import _partition, _state, parse
from .schemas import Base, Extensions, FunctionCall, Message, ToolCall
from .sequence import Output
from .streaming import _error, _split, failure, gather, named_event, outputs
from .tools import ToolCallFilter

router = APIRouter()

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}  # and "tool_use" when the reply calls tools


class Block(Base):
    """Any content block; what each type needs is checked in `_blocks` with a clear message."""

    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list["Block"] | None = None
    is_error: bool | None = None


class AMessage(Base):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ATool(Base):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; Anthropic's server tools (web search...) run on their side


class AToolChoice(Base):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AThinking(Base):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None  # accepted, not enforced: thinking ends when the model ends it


class MessagesRequest(Extensions):
    model: str | None = None  # any name; the server has one model
    messages: list[AMessage]
    system: str | list[Block] | None = None
    max_tokens: int | None = None  # required for /v1/messages (checked there), not for count_tokens
    temperature: float | None = Field(None, ge=0, le=2)  # Anthropic's range is [0, 1]; OpenAI's [0, 2] also works
    top_p: float | None = Field(None, gt=0, le=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    tools: list[ATool] | None = None
    tool_choice: AToolChoice | None = None
    thinking: AThinking | None = None
    metadata: dict[str, Any] | None = None


@router.post("/v1/messages")
@router.post("/messages")
async def messages(request: Request):
    st = _state(request)
    st.require_ready()
    req, chars = await parse(request, MessagesRequest)
    if req.max_tokens is None:
        raise invalid("max_tokens: Field required", "max_tokens")
    ids, chat_tools = await _prompt(st, req, chars)
    sampling = req.sampling(temperature=req.temperature, top_p=req.top_p, stop=req.stop_sequences, user=_user(req))
    job = params.job(sampling, ids, req.max_tokens, "max_tokens", "messages", st.info, st.config.defaults, st.config,
                     _partition(request, sampling))
    splitter = await run_in_threadpool(st.prompts.splitter, ids, ToolCallFilter.for_request(st.tokenizer, chat_tools,
                                                                                            "auto"))
    handle = Handle(st.scheduler, job, st.config.request_timeout, request.receive)  # 429/503 before any reply
    reply = Reply(st.info.id, len(ids))
    if req.stream:
        return StreamingResponse(reply.stream(handle, splitter, st.config.keepalive_interval, request.url.path),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    whole = await gather(handle, splitter)
    return Response(status_code=499) if whole is None else JSONResponse(reply.whole(*whole))


@router.post("/v1/messages/count_tokens")
@router.post("/messages/count_tokens")
async def count_tokens(request: Request):
    """The prompt's tokens: equal to input_tokens + cache_read_input_tokens of the same request's usage."""
    st = _state(request)
    st.require_ready()
    req, chars = await parse(request, MessagesRequest)
    ids, _ = await _prompt(st, req, chars)
    return {"input_tokens": len(ids)}


async def _prompt(st, req: MessagesRequest, chars: dict) -> tuple[list[int], list[dict] | None]:
    """The request's prompt tokens, rendered as Chat Completions would render the same conversation."""
    params.check_counts(len(req.messages) + 1, len(req.tools or ()), st.config)
    params.check_prompt_chars(sum(chars.get(k, 0) for k in ("messages", "system", "tools")), st.info, "messages")
    tools = _tools(req)
    kwargs = {} if req.thinking is None else {"enable_thinking": req.thinking.type != "disabled"}
    ids = await run_in_threadpool(st.prompts.chat, to_chat(req), tools, kwargs)
    return ids, tools


def _user(req: MessagesRequest) -> str | None:
    """Claude Code sends `metadata.user_id`: it keeps that client's prefix caches apart, like `user`."""
    uid = (req.metadata or {}).get("user_id")
    return req.user or (uid if isinstance(uid, str) else None)


def _tools(req: MessagesRequest) -> list[dict] | None:
    choice = req.tool_choice.type if req.tool_choice is not None else "auto"
    if choice in ("any", "tool"):
        raise invalid(f"tool_choice {choice!r} (forcing a tool call) is not supported (no constrained decoding); "
                      "use 'auto'", "tool_choice")
    for t in req.tools or ():
        if t.type not in (None, "custom"):
            raise invalid(f"tool {t.name!r}: server tools (type {t.type[:64]!r}) are not supported; "
                          "only client tools with an input_schema", "tools")
    if not req.tools or choice == "none":
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema or {"type": "object"}}}
            for t in req.tools]


def to_chat(req: MessagesRequest) -> list[Message]:
    """Anthropic turns as chat messages: tool results become `tool` messages, tool_use blocks `tool_calls`."""
    if not req.messages:
        raise invalid("messages: at least one message is required", "messages")
    try:
        out = [Message(role="system", content=_text(req.system, "system"))] if req.system else []
        for i, m in enumerate(req.messages):
            out += _turn(m, f"messages.{i}")
        return out
    except ValidationError as e:
        raise invalid(f"messages: {e.errors()[0]['msg']}", "messages") from None


def _turn(m: AMessage, where: str) -> list[Message]:
    if isinstance(m.content, str):
        return [Message(role=m.role, content=m.content)]
    texts, thinking, calls, results = [], [], [], []
    for j, b in enumerate(m.content):
        at = f"{where}.content.{j}"
        if b.type == "text":
            texts.append(_need(b.text, at, "text"))
        elif b.type == "thinking" and m.role == "assistant":
            thinking.append(b.thinking or "")
        elif b.type == "redacted_thinking" and m.role == "assistant":
            continue  # encrypted by Anthropic: nothing a local template could render
        elif b.type == "tool_use" and m.role == "assistant":
            calls.append(ToolCall(id=_need(b.id, at, "id"), function=FunctionCall(name=_need(b.name, at, "name"),
                                                                                   arguments=b.input or {})))
        elif b.type == "tool_result" and m.role == "user":
            body = _text(b.content, at) if b.content is not None else ""
            results.append(Message(role="tool", content=("[error] " if b.is_error else "") + body,
                                   tool_call_id=_need(b.tool_use_id, at, "tool_use_id")))
        else:
            raise invalid(f"{at}: content blocks of type {b.type[:64]!r} are not supported in {m.role} messages",
                          where)
    if m.role == "user":
        return results + ([Message(role="user", content="\n".join(texts))] if texts or not results else [])
    return [Message(role="assistant", content="".join(texts), tool_calls=calls or None,
                    reasoning_content="".join(thinking) or None)]


def _text(content, where: str) -> str:
    """A string, or the text of text blocks (system prompts, tool results); other blocks are a 400."""
    if isinstance(content, str):
        return content
    parts = []
    for j, b in enumerate(content):
        if b.type != "text":
            raise invalid(f"{where}.{j}: only text blocks are supported here, not {b.type[:64]!r}", where)
        parts.append(_need(b.text, f"{where}.{j}", "text"))
    return "\n".join(parts)


def _need(value, where: str, name: str):
    if value is None:
        raise invalid(f"{where}.{name}: Field required", where)
    return value


class Reply:
    """One reply's message id, blocks and usage, whole or as Anthropic's stream events."""

    def __init__(self, model: str, prompt_tokens: int):
        self.id, self.model, self.prompt_tokens = f"msg_{uuid.uuid4().hex[:24]}", model, prompt_tokens

    def whole(self, thought: str, text: str, calls: list[dict], out: Output) -> dict:
        blocks = ([{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []) + \
                 ([{"type": "text", "text": text}] if text else []) + [_tool_use(c) for c in calls]
        return {**self._message(blocks, _stop_reason(out, calls), out.stop_string), "usage": usage(out),
                "speculative": speculative(out)}

    def _message(self, content: list, stop_reason: str | None, stop_sequence: str | None = None) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence}

    async def stream(self, handle: Handle, splitter, keepalive: float, path: str) -> AsyncIterator[str]:
        start = {**self._message([], None), "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        blocks = Blocks()
        try:
            yield named_event("message_start", {"type": "message_start", "message": start})
            async for out in outputs(handle, keepalive):
                if out is None:
                    yield named_event("ping", {"type": "ping"})
                    continue
                if out.error is not None:
                    yield named_event("error", _error(failure(out.error), path))
                    return
                if out.finish_reason == "abort":
                    return
                thought, text, calls = _split(out, splitter)
                for e in blocks.add("thinking", thought) + blocks.add("text", text) + \
                        [e for c in calls for e in blocks.tool(c)]:
                    yield e
                if out.finish_reason is not None:
                    for e in blocks.close():
                        yield e
                    delta = {"stop_reason": _stop_reason(out, blocks.calls), "stop_sequence": out.stop_string}
                    yield named_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(out),
                                                        "speculative": speculative(out)})
                    yield named_event("message_stop", {"type": "message_stop"})
                    return
        finally:
            handle.close()


class Blocks:
    """Content blocks as they stream: a block starts when the kind of output changes, and stops before the next."""

    def __init__(self):
        self.index, self.open, self.calls = -1, None, []

    def add(self, kind: str, text: str) -> list[str]:
        if not text:
            return []
        events = [] if self.open == kind else self.close() + self._start(
            {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""})
        self.open = kind
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta",
                                                                                        "text": text}
        return events + [self._delta(delta)]

    def tool(self, call: dict) -> list[str]:
        """A whole call (held back until parsed): its start, its input as one JSON delta, its stop."""
        self.calls.append(call)
        block = {**_tool_use(call), "input": {}}
        args = json.dumps(_tool_use(call)["input"], ensure_ascii=False)
        events = self.close() + self._start(block) + [self._delta({"type": "input_json_delta", "partial_json": args})]
        self.open = "tool_use"
        return events + self.close()

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, block: dict) -> list[str]:
        self.index += 1
        return [named_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                    "content_block": block})]

    def _delta(self, delta: dict) -> str:
        return named_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})


def usage(out: Output) -> dict:
    """Anthropic counts prompt tokens read from a cache apart: input_tokens + cache_read_input_tokens is the prompt."""
    return {"input_tokens": out.prompt_tokens - out.cached_tokens, "output_tokens": out.completion_tokens,
            "cache_read_input_tokens": out.cached_tokens, "cache_creation_input_tokens": 0}


def _stop_reason(out: Output, calls: list) -> str:
    if calls:
        return "tool_use"
    return "stop_sequence" if out.stop_string else STOP_REASONS.get(out.finish_reason, "end_turn")


def _tool_use(call: dict) -> dict:
    raw = call["function"]["arguments"]
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        args = None
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": args if isinstance(args, dict) else {"arguments": raw}}
