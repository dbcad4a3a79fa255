"""Server settings: one dataclass, checked once, built from argparse only in `cli.py`."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mlx_spec import MlxSpecError, SamplingParams


@dataclass(frozen=True)
class ModelConfig:
    target: str | None = None  # None: the embedded model
    drafter: str | None = "auto"  # None: plain decoding
    block_size: int | None = None
    dtype: str | None = None
    served_name: str | None = None  # the id /v1/models reports; never used to find files
    mode: str = "auto"  # how to draft (see `mlx_spec.load`)
    kernels: bool = True
    prefill_chunk: int = 512  # prompt tokens per scheduler step while others decode
    kv_bits: int | None = None  # quantized KV caches (see `mlx_spec.load`); None: full precision
    kv_group_size: int = 64


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out (set by `mlx-spec serve` flags)."""

    sampling: SamplingParams = SamplingParams()
    max_tokens: int | None = None  # None: up to the context window (chat), 16 (completions, as OpenAI)
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class LearnConfig:
    """--learn and --adapt-when-idle (see `mlx_spec.history` and `idle.py`)."""

    record: bool = False  # keep each request's prompt and output token ids in the local history
    cap_bytes: int = 256 << 20
    adapt_when_idle: float = 0.0  # seconds without a request before adapting in the background; 0: never
    min_new_records: int = 100  # recorded requests since the last adaptation that start another


@dataclass(frozen=True)
class ServerConfig:
    model: ModelConfig = ModelConfig()
    defaults: Defaults = Defaults()
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()  # any of them opens the API; each has its own prefix caches
    allowed_hosts: tuple[str, ...] = ()  # extra Host-header names; loopback names are always allowed
    cors_origins: tuple[str, ...] = ()  # extra origins; localhost origins are always allowed
    max_active: int = 8  # requests in the verify loop at once
    max_queue: int = 64  # requests waiting for a slot; more get 429
    request_timeout: float = 600.0  # seconds; generation then stops with finish_reason "length"
    keepalive_interval: float = 5.0  # seconds between SSE ':' comments while nothing else is sent
    retry_after: int = 1  # seconds, sent with 429/503
    prefix_cache_size: int = 4  # idle conversation caches kept for prefix reuse
    max_body_bytes: int = 4 << 20
    max_header_bytes: int = 16 << 10
    max_connections: int = 256  # open sockets; past it the oldest idle one is closed (see connections.py)
    header_timeout: float = 10.0  # seconds for a request's head to arrive in full, from connect or last reply
    body_timeout: float = 60.0  # seconds for a request's body to arrive in full, once its head is in
    max_messages: int = 4096
    max_stop: int = 64  # stop matching costs O(count x length^2) per round, paid by every active request
    max_stop_chars: int = 256
    max_tools: int = 256
    shutdown_timeout: float = 10.0  # seconds in-flight requests get to finish on shutdown
    log_level: str = "info"
    learn: LearnConfig = LearnConfig()

    def __post_init__(self):
        checks = [
            (bool(self.api_keys) or is_loopback(self.host),
             f"refusing to listen on non-loopback address {self.host} without --api-key"),
            (all(len(k) >= 8 for k in self.api_keys), "--api-key must be at least 8 characters"),
            (0 <= self.port < 65536, "port must be in [0, 65535]"),
            (self.max_active >= 1, "max_active must be >= 1"),
            (self.max_queue >= 0, "max_queue must be >= 0"),
            (self.request_timeout > 0, "request_timeout must be > 0"),
            (self.keepalive_interval > 0, "keepalive_interval must be > 0"),
            (self.prefix_cache_size >= 0, "prefix_cache_size must be >= 0"),
            (self.max_body_bytes >= 1024, "max_body_bytes must be >= 1024"),
            (self.max_connections >= 1, "max_connections must be >= 1"),
            (self.header_timeout > 0 and self.body_timeout > 0, "header_timeout and body_timeout must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise MlxSpecError(message)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
