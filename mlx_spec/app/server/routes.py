"""The endpoints. Each path also answers without the /v1 prefix, as clients configured either way expect."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from . import params
from .body import check_length, decode
from .errors import APIError
from .handle import Handle
from .responses import ChatFormat, CompletionFormat, Format
from .schemas import ChatRequest, CompletionRequest
from .state import ServerState
from .streaming import collect, sse
from .tools import ToolCallFilter

router = APIRouter()


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/health")
async def health(request: Request):
    st = _state(request)
    status = st.status
    body = {"status": status}
    if status == "error":
        body["error"] = str(st.scheduler.load_error)
    return JSONResponse(body, status_code=200 if status == "ok" else 503,
                        headers=None if status == "ok" else {"Retry-After": str(st.config.retry_after)})


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request):
    st = _state(request)
    st.require_ready()
    card = {"id": st.info.id, "object": "model", "created": 0, "owned_by": "mlx-spec",
            "context_length": st.info.context_length, "speculative": st.info.speculative}
    return {"object": "list", "data": [card]}


@router.get("/metrics")
async def metrics(request: Request):
    return PlainTextResponse(_state(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(request: Request):
    st = _state(request)
    st.require_ready()
    req, chars = await parse(request, ChatRequest)
    params.check_chat(req, st.config)
    params.check_prompt_chars(chars.get("messages", 0) + chars.get("tools", 0), st.info, "messages")
    use_tools = bool(req.tools) and req.tool_choice != "none"
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if use_tools else None
    kwargs = params.template_kwargs(req.chat_template_kwargs)
    ids = await run_in_threadpool(st.prompts.chat, req.messages, tools, kwargs)
    job = params.chat_job(req, ids, st.info, st.config.defaults, st.config, _partition(request, req))
    fmt = ChatFormat(st.info.id, include_usage=_include_usage(req))
    splitter = await run_in_threadpool(st.prompts.splitter, ids,
                                       ToolCallFilter.for_request(st.tokenizer, tools, req.tool_choice))
    return await respond(request, st, job, fmt, splitter, req.stream)


@router.post("/v1/completions")
@router.post("/completions")
async def completions(request: Request):
    st = _state(request)
    st.require_ready()
    req, chars = await parse(request, CompletionRequest)
    params.check_completion(req)
    params.check_prompt_chars(chars.get("prompt", 0), st.info, "prompt")
    ids = await run_in_threadpool(st.prompts.completion, req.prompt)
    job = params.completion_job(req, ids, st.info, st.config.defaults, st.config, _partition(request, req))
    fmt = CompletionFormat(st.info.id, include_usage=_include_usage(req))
    return await respond(request, st, job, fmt, None, req.stream)


async def respond(request: Request, st: ServerState, job, fmt: Format, tools, stream: bool) -> Response:
    handle = Handle(st.scheduler, job, st.config.request_timeout, request.receive)
    if stream:
        return StreamingResponse(sse(handle, fmt, tools, st.config.keepalive_interval), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    body = await collect(handle, fmt, tools)
    return JSONResponse(body) if body is not None else Response(status_code=499)


async def parse(request: Request, model: type[BaseModel]):
    """The validated request and its characters per field; JSON work runs in the threadpool (see body.py)."""
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone mid-body (or cut off by the body timeout): nobody reads the answer
        raise APIError(400, "the client disconnected before sending the whole body") from None
    check_length(raw, _state(request).info.max_prompt_chars)
    return await run_in_threadpool(decode, raw, model)


def _partition(request: Request, req) -> tuple[str, str]:
    """Whose idle caches this request may reuse: its API key's, and within that its `user` or cache key's."""
    return getattr(request.state, "key_id", ""), req.prompt_cache_key or req.user or ""


def _include_usage(req) -> bool:
    return bool(req.stream and req.stream_options is not None and req.stream_options.include_usage)
