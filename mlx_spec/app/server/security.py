"""Request gates, outermost first: Host allowlist, cross-site requests, CORS, API key, header and body size.

Host allowlist: a web page on a rebound DNS name (Ollama CVE-2024-28224) reaches a loopback
server with a foreign Host header; we refuse those. Cross-site: a page on any site may POST a
"simple" request (text/plain, form types, no preflight) to 127.0.0.1; we refuse bodies that are
not JSON and foreign Origins before any work. CORS: localhost origins only, no credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from .config import ServerConfig, is_loopback
from .errors import APIError, error_response

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
LOCAL_ORIGINS = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
OPEN_PATHS = ("/health",)


def middleware(cfg: ServerConfig) -> list[Middleware]:
    allowed = None
    if is_loopback(cfg.host) or cfg.allowed_hosts:
        allowed = {*LOOPBACK_NAMES, *(h.lower() for h in cfg.allowed_hosts), cfg.host.strip("[]").lower()}
    origins = (re.compile(LOCAL_ORIGINS), set(cfg.cors_origins))
    return [
        Middleware(HostCheck, allowed=allowed),
        Middleware(CrossSiteCheck, origins=origins),
        Middleware(CORSMiddleware, allow_origins=list(cfg.cors_origins), allow_origin_regex=LOCAL_ORIGINS,
                   allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"], allow_credentials=False),
        Middleware(ApiKeyCheck, keys=cfg.api_keys),
        Middleware(SizeLimits, body=cfg.max_body_bytes, headers=cfg.max_header_bytes),
    ]


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostCheck:
    def __init__(self, app, allowed: set[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.allowed is not None:
            host = header(scope, b"host")
            if host is not None and hostname(host) not in self.allowed:
                response = error_response(403, f"Host {host[:100]!r} is not allowed (see --allowed-host)",
                                          code="host_not_allowed", path=scope["path"])
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class CrossSiteCheck:
    """415 for a POST whose body is not declared JSON, 403 for a request with a foreign Origin.

    Browsers send text/plain, form and multipart bodies (and a typeless Blob) cross-site without
    a preflight, so CORS alone never gets to say no; a JSON content type forces the preflight.
    A request without Origin (curl, SDKs) is not a browser's cross-site request.
    """

    def __init__(self, app, origins: tuple[re.Pattern, set[str]]):
        self.app, (self.local, self.extra) = app, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] != "OPTIONS":  # preflights are CORS's to answer
            origin = header(scope, b"origin")
            if origin is not None and not (self.local.match(origin) or origin in self.extra):
                response = error_response(403, f"Origin {origin[:100]!r} is not allowed (see --cors-origin)",
                                          code="origin_not_allowed", path=scope["path"])
                return await response(scope, receive, send)
            if scope["method"] == "POST" and not is_json(header(scope, b"content-type")):
                response = error_response(415, "the request body must be JSON (Content-Type: application/json)",
                                          code="unsupported_media_type", path=scope["path"])
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.partition(";")[0].strip().lower() == "application/json"


class ApiKeyCheck:
    """Bearer token or X-Api-Key, compared in constant time. /health and CORS preflights need none.

    The matching key's fingerprint goes into the request state as `key_id`: the prefix cache
    keeps each key's conversations apart (see prefix_cache.py).
    """

    def __init__(self, app, keys: tuple[str, ...]):
        self.app, self.keys = app, [k.encode() for k in keys]

    async def __call__(self, scope, receive, send):
        if self.keys and scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"] not in OPEN_PATHS:
            key = self._match(scope)
            if key is None:
                response = error_response(401, "missing or invalid API key", code="invalid_api_key",
                                          headers={"WWW-Authenticate": "Bearer"}, path=scope["path"])
                return await response(scope, receive, send)
            scope.setdefault("state", {})["key_id"] = hashlib.sha256(key).hexdigest()[:16]
        await self.app(scope, receive, send)

    def _match(self, scope) -> bytes | None:
        given = header(scope, b"x-api-key")
        auth = header(scope, b"authorization")
        if auth is not None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is None:
            return None
        given_bytes, found = given.encode("latin-1"), None
        for key in self.keys:  # every key is compared: the time does not say which one matched
            if hmac.compare_digest(given_bytes, key):
                found = key
        return found


class SizeLimits:
    """400 for oversized headers; 413 for a body over the limit, by Content-Length or counted as it arrives.

    h11 bounds only headers that arrive in pieces; this bounds what arrives in one read too.
    """

    def __init__(self, app, body: int, headers: int):
        self.app, self.body, self.headers = app, body, headers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.headers:
            return await error_response(400, f"request headers are larger than {self.headers} bytes",
                                        code="headers_too_large", path=scope["path"])(scope, receive, send)
        length = header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.body):
            e = self._error()
            return await error_response(e.status, e.message, code=e.code, path=scope["path"])(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.body:
                raise self._error()
            return message

        await self.app(scope, counted, send)

    def _error(self) -> APIError:
        return APIError(413, f"request body is larger than {self.body} bytes", code="request_too_large")
