"""Errors in the shape of the API a path belongs to.

OpenAI paths: {"error": {message, type, param, code}}. Anthropic's Messages paths:
{"type": "error", "error": {type, message}}, the shape the `anthropic` client parses. The
middleware (security.py) answers before any route runs, so the shape is chosen by path.

Deterministic failures are 4xx: the `openai` client retries 5xx (and 408/409/429),
which would replay a long generation that can only fail again.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("mlx_spec.server")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 501: "not_implemented_error", 503: "unavailable_error"}


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors); its clients retry 429 and 5xx.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                   415: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}
ANTHROPIC_PATHS = ("/v1/messages", "/messages")


def is_anthropic(path: str | None) -> bool:
    """Whether `path` is one of the Messages API's (its errors take Anthropic's shape)."""
    path = (path or "").rstrip("/")
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers, self.extra = headers or {}, extra or {}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(status: int, message: str, code: str | None = None, param: str | None = None,
               extra: dict | None = None, path: str | None = None) -> dict:
    if is_anthropic(path):
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    err = {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": code}
    return {"error": {**err, **(extra or {})}}


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict | None = None, extra: dict | None = None, path: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param, extra, path), status_code=status, headers=headers)


def from_api_error(e: APIError, path: str | None = None) -> JSONResponse:
    return error_response(e.status, e.message, code=e.code, param=e.param, headers=e.headers, extra=e.extra,
                          path=path)


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, lambda request, e: from_api_error(e, request.url.path))
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
    # FastAPI answers 422; OpenAI clients expect 400 (vLLM converts the same way).
    first = (e.errors() or [{}])[0]
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return error_response(400, f"{param or 'body'}: {first.get('msg', 'invalid request')}", param=param,
                          path=request.url.path)


def _http(request: Request, e: HTTPException) -> JSONResponse:
    return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None), path=request.url.path)


def _unexpected(request: Request, e: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path)
    return error_response(500, f"internal error: {type(e).__name__}", code="internal_error", path=request.url.path)
