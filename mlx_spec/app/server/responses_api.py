"""OpenAI's Responses API: POST /v1/responses (Codex, newer `openai` SDK code). Stateless.

Nothing is stored: a response cannot be fetched or continued by id, so `previous_response_id`
(and `background`) are refused with a 400 and every response says `"store": false`; clients send
the whole conversation as `input` items (Codex does). The input becomes the same chat messages
Chat Completions renders. Output items: `reasoning` (the model's thinking), `message`
(`output_text`) and `function_call`. A stream sends OpenAI's typed events, each with an
`event:` line and a `sequence_number`: response.created, response.in_progress, per item
output_item.added / deltas / done, then response.completed (response.incomplete when the token
limit ended it, response.failed when generation failed).
"""

from __future__ import annotations

import time
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
from .streaming import _split, failure, gather, named_event, outputs
from .tools import ToolCallFilter

router = APIRouter()

TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
THINKING_OFF = ("none", "minimal")  # reasoning efforts that turn a template's thinking off


class Part(Base):
    type: str
    text: str | None = None


class Item(Base):
    """Any input item; what each type needs is checked in `_item` with a clear message."""

    type: str | None = None  # "message" when absent and `role` is given
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[Part] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[Part] | None = None
    summary: list[Part] | None = None


class RTool(Base):
    type: str
    name: str | None = Field(None, min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Reasoning(Base):
    effort: str | None = None
    summary: str | None = None


class TextConfig(Base):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(Extensions):
    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    tools: list[RTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None  # accepted; nothing is stored either way
    previous_response_id: str | None = None
    background: bool | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    truncation: str | None = None


@router.post("/v1/responses")
@router.post("/responses")
async def responses(request: Request):
    st = _state(request)
    st.require_ready()
    req, chars = await parse(request, ResponsesRequest)
    _check(req)
    n_items = 1 if isinstance(req.input, str) else len(req.input)
    params.check_counts(n_items + 1, len(req.tools or ()), st.config)
    params.check_prompt_chars(sum(chars.get(k, 0) for k in ("input", "instructions", "tools")), st.info, "input")
    tools = _tools(req)
    effort = req.reasoning.effort if req.reasoning is not None else None
    kwargs = {} if effort is None else {"enable_thinking": effort not in THINKING_OFF}
    ids = await run_in_threadpool(st.prompts.chat, to_chat(req), tools, kwargs)
    sampling = req.sampling(temperature=req.temperature, top_p=req.top_p)
    job = params.job(sampling, ids, req.max_output_tokens, "max_output_tokens", "input", st.info, st.config.defaults,
                     st.config, _partition(request, sampling))
    splitter = await run_in_threadpool(st.prompts.splitter, ids, ToolCallFilter.for_request(st.tokenizer, tools, "auto"))
    handle = Handle(st.scheduler, job, st.config.request_timeout, request.receive)  # 429/503 before any reply
    reply = Reply(st.info.id, req)
    if req.stream:
        return StreamingResponse(reply.stream(handle, splitter, st.config.keepalive_interval),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    whole = await gather(handle, splitter)
    if whole is None:
        return Response(status_code=499)
    thought, text, calls, out = whole
    return JSONResponse(reply.final([i for i in reply.items(thought, text, calls)], out))


def _check(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise invalid("previous_response_id is not supported: this server stores no responses; send the whole "
                      "conversation as input", "previous_response_id")
    if req.background:
        raise invalid("background responses are not supported (nothing is stored)", "background")
    fmt = (req.text.format or {}).get("type") if req.text is not None else None
    if fmt not in (None, "text"):
        raise invalid(f"text.format {str(fmt)[:64]!r} is not supported (no constrained decoding)", "text.format")
    if req.truncation not in (None, "disabled"):
        raise invalid("truncation 'auto' is not supported: a prompt too long for the context is refused", "truncation")
    if req.tool_choice not in (None, "auto", "none"):
        raise invalid("forcing a tool call is not supported (no constrained decoding); use 'auto'", "tool_choice")


def _tools(req: ResponsesRequest) -> list[dict] | None:
    for t in req.tools or ():
        if t.type != "function":
            raise invalid(f"tools of type {t.type[:64]!r} are not supported; only function tools", "tools")
        if t.name is None:
            raise invalid("tools: a function tool needs a name", "tools")
    if not req.tools or req.tool_choice == "none":
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters or {"type": "object"}}} for t in req.tools]


def to_chat(req: ResponsesRequest) -> list[Message]:
    """Instructions and input items as chat messages; function calls and outputs as tool_calls and tool messages."""
    out = [Message(role="system", content=req.instructions)] if req.instructions else []
    if isinstance(req.input, str):
        return out + [Message(role="user", content=req.input)]
    if not req.input:
        raise invalid("input must not be empty", "input")
    reasoning: list[str] = []  # a reasoning item belongs to the assistant turn after it
    try:
        for i, item in enumerate(req.input):
            _item(item, f"input.{i}", out, reasoning)
    except ValidationError as e:
        raise invalid(f"input: {e.errors()[0]['msg']}", "input") from None
    return out


def _item(item: Item, at: str, out: list[Message], reasoning: list[str]) -> None:
    kind = item.type or ("message" if item.role else None)
    if kind == "message":
        if item.role is None:
            raise invalid(f"{at}.role: Field required", "input")
        text = _text(item.content, at)
        if item.role == "assistant":
            out.append(Message(role="assistant", content=text, reasoning_content="".join(reasoning) or None))
            reasoning.clear()
        else:
            out.append(Message(role=item.role, content=text))
    elif kind == "function_call":
        if item.name is None or item.call_id is None:
            raise invalid(f"{at}: a function_call needs name and call_id", "input")
        call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments or "{}"))
        last = out[-1] if out else None
        if last is not None and last.role == "assistant" and not reasoning:  # parallel calls share one turn
            last.tool_calls = [*(last.tool_calls or []), call]
        else:
            out.append(Message(role="assistant", content="", tool_calls=[call],
                               reasoning_content="".join(reasoning) or None))
            reasoning.clear()
    elif kind == "function_call_output":
        if item.call_id is None:
            raise invalid(f"{at}.call_id: Field required", "input")
        out.append(Message(role="tool", content=_text(item.output, at), tool_call_id=item.call_id))
    elif kind == "reasoning":
        reasoning.append(_text(item.content, at) if item.content else _text(item.summary or [], at))
    else:
        raise invalid(f"{at}: input items of type {str(kind)[:64]!r} are not supported", "input")


def _text(content, at: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, p in enumerate(content):
        if p.type not in TEXT_PARTS or p.text is None:
            raise invalid(f"{at}.content.{j}: only text parts are supported, not {p.type[:64]!r}", "input")
        parts.append(p.text)
    return "\n".join(parts)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Reply:
    """One response: its envelope (echoing the request's settings), its output items, whole or streamed."""

    def __init__(self, model: str, req: ResponsesRequest):
        self.id, self.created, self.model, self.req = _id("resp"), int(time.time()), model, req

    def envelope(self, status: str, output: list[dict], out: Output | None = None) -> dict:
        r = self.req
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
                "output": output, "error": None, "incomplete_details": None, "instructions": r.instructions,
                "max_output_tokens": r.max_output_tokens, "parallel_tool_calls": r.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": {"effort": r.reasoning.effort if r.reasoning else None,
                                                            "summary": None},
                "store": False, "temperature": r.temperature, "top_p": r.top_p, "text": {"format": {"type": "text"}},
                "tool_choice": r.tool_choice or "auto", "tools": [t.model_dump(exclude_none=True) for t in r.tools or ()],
                "truncation": "disabled", "metadata": r.metadata or {}, "usage": None}
        if out is not None:
            body["usage"] = usage(out)
            body["speculative"] = speculative(out)
            if out.finish_reason == "length" and status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    def final(self, output: list[dict], out: Output) -> dict:
        calls = any(i["type"] == "function_call" for i in output)
        return self.envelope("incomplete" if out.finish_reason == "length" and not calls else "completed", output, out)

    def items(self, thought: str, text: str, calls: list[dict]) -> list[dict]:
        out = [reasoning_item(_id("rs"), thought)] if thought else []
        out += [message_item(_id("msg"), text, "completed")] if text else []
        return out + [call_item(_id("fc"), c, "completed") for c in calls]

    async def stream(self, handle: Handle, splitter, keepalive: float) -> AsyncIterator[str]:
        ev = Events()
        try:
            yield ev("response.created", response=self.envelope("in_progress", []))
            yield ev("response.in_progress", response=self.envelope("in_progress", []))
            async for out in outputs(handle, keepalive):
                if out is None:
                    yield ": keepalive\n\n"
                    continue
                if out.error is not None:
                    e = failure(out.error)
                    failed = {**self.envelope("failed", ev.done), "error": {"code": e.code or "server_error",
                                                                            "message": e.message}}
                    yield ev("response.failed", response=failed)
                    return
                if out.finish_reason == "abort":
                    return
                thought, text, calls = _split(out, splitter)
                for e in ev.add("reasoning", thought) + ev.add("message", text) + [x for c in calls for x in ev.call(c)]:
                    yield e
                if out.finish_reason is not None:
                    for e in ev.close():
                        yield e
                    final = self.final(ev.done, out)
                    yield ev("response.completed" if final["status"] == "completed" else "response.incomplete",
                             response=final)
                    return
        finally:
            handle.close()


class Events:
    """Typed stream events with their sequence numbers; tracks the output item being written."""

    def __init__(self):
        self.seq, self.done, self.open, self.text = 0, [], None, ""

    def __call__(self, kind: str, **fields) -> str:
        self.seq += 1
        return named_event(kind, {"type": kind, "sequence_number": self.seq - 1, **fields})

    def add(self, kind: str, text: str) -> list[str]:
        if not text:
            return []
        events = [] if self.open is not None and self.open[0] == kind else self.close() + self._start(kind)
        self.text += text
        where = {"item_id": self.open[1], "output_index": len(self.done), "content_index": 0}
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return events + [self(name, **where, delta=text, **extra)]

    def call(self, call: dict) -> list[str]:
        """A whole call (held back until parsed): added, its arguments as one delta, done."""
        item_id, args = _id("fc"), call["function"]["arguments"]
        where = {"item_id": item_id, "output_index": len(self.done)}
        events = self.close() + [self("response.output_item.added", output_index=len(self.done),
                                      item={**call_item(item_id, call, "in_progress"), "arguments": ""})]
        events += [self("response.function_call_arguments.delta", **where, delta=args),
                   self("response.function_call_arguments.done", **where, arguments=args)]
        item = call_item(item_id, call, "completed")
        self.done.append(item)
        return events + [self("response.output_item.done", output_index=len(self.done) - 1, item=item)]

    def _start(self, kind: str) -> list[str]:
        item_id = _id("rs" if kind == "reasoning" else "msg")
        self.open, self.text = (kind, item_id), ""
        index = len(self.done)
        if kind == "reasoning":
            return [self("response.output_item.added", output_index=index, item=reasoning_item(item_id, None))]
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [self("response.output_item.added", output_index=index, item=message_item(item_id, None, "in_progress")),
                self("response.content_part.added", **where, part=_text_part(""))]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        (kind, item_id), text, index = self.open, self.text, len(self.done)
        self.open = None
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if kind == "reasoning":
            item = reasoning_item(item_id, text)
            events = [self("response.reasoning_text.done", **where, text=text)]
        else:
            item = message_item(item_id, text, "completed")
            events = [self("response.output_text.done", **where, text=text, logprobs=[]),
                      self("response.content_part.done", **where, part=_text_part(text))]
        self.done.append(item)
        return events + [self("response.output_item.done", output_index=index, item=item)]


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [_text_part(text)]}


def reasoning_item(item_id: str, text: str | None) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call: dict, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def usage(out: Output) -> dict:
    return {"input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": out.cached_tokens},
            "output_tokens": out.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.prompt_tokens + out.completion_tokens}
