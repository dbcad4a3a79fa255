"""`mlx-spec serve`: an OpenAI-compatible server for editors, agents and chat front ends."""

from __future__ import annotations

import os

from mlx_spec import MlxSpecError
from mlx_spec.history import add_learn_arguments
from mlx_spec.options import add_model_arguments, add_sampling_arguments, sampling_from

from .config import Defaults, LearnConfig, ModelConfig, ServerConfig


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--prefill-chunk", type=int, default=512, help="prompt tokens per step while others decode")
    add_sampling_arguments(p)  # here: defaults for requests that leave a field out
    p.set_defaults(max_tokens=None)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs --api-key)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", action="append", default=None,
                   help="require this key as Bearer token or X-Api-Key; repeatable, one per client "
                        "(default: $MLX_SPEC_API_KEY, comma-separated)")
    p.add_argument("--served-model-name", default=None, help="model id to report (default: the model folder name)")
    p.add_argument("--allowed-host", action="append", default=[], help="extra allowed Host header (repeatable)")
    p.add_argument("--cors-origin", action="append", default=[], help="extra allowed CORS origin (repeatable)")
    p.add_argument("--max-active", type=int, default=8, help="requests generating at once")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting for a slot before 429")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--prefix-cache-size", type=int, default=4, help="idle conversation caches kept for reuse")
    p.add_argument("--max-body-mb", type=float, default=4.0)
    p.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds in-flight requests get on shutdown")
    p.add_argument("--max-connections", type=int, default=256, help="open sockets; past it the oldest idle is closed")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds for a request's headers to arrive")
    p.add_argument("--body-timeout", type=float, default=60.0, help="seconds for a request's body to arrive")
    add_learn_arguments(p)
    p.add_argument("--adapt-when-idle", type=float, default=0.0, metavar="SECONDS",
                   help="adapt the drafter to the recorded history when no request came for this long (0: never)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    from mlx_spec.distributed.cli import add_distributed_arguments

    add_distributed_arguments(p)  # --distributed: rank 0 listens, the other ranks follow its schedule


def config_from(args) -> ServerConfig:
    model = ModelConfig(target=args.model, drafter=None if args.no_draft else args.drafter,
                        block_size=args.block_size, dtype=args.dtype, served_name=args.served_model_name,
                        mode=args.mode, kernels=not args.no_kernels, prefill_chunk=args.prefill_chunk,
                        kv_bits=args.kv_bits, kv_group_size=args.kv_group_size)
    defaults = Defaults(sampling_from(args), args.max_tokens, tuple(args.stop))
    return ServerConfig(
        model=model, defaults=defaults, host=args.host, port=args.port, api_keys=api_keys(args.api_key),
        allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors_origin), max_active=args.max_active,
        max_queue=args.max_queue, request_timeout=args.request_timeout, prefix_cache_size=args.prefix_cache_size,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), shutdown_timeout=args.shutdown_timeout,
        max_connections=args.max_connections, header_timeout=args.header_timeout, body_timeout=args.body_timeout,
        log_level=args.log_level, learn=LearnConfig(record=args.learn, cap_bytes=int(args.learn_cap * (1 << 20)),
                                                    adapt_when_idle=args.adapt_when_idle))


def api_keys(given: list[str] | None) -> tuple[str, ...]:
    keys = given if given is not None else os.environ.get("MLX_SPEC_API_KEY", "").split(",")
    return tuple(k.strip() for k in keys if k.strip())


def run(args) -> int:
    cfg = config_from(args)  # refuses a non-loopback address without a key, before anything loads
    if args.distributed:
        from mlx_spec.distributed.serve import run_serve

        return run_serve(args, cfg)
    from .app import create_app
    from .serve import make_server

    app = create_app(cfg)
    make_server(app, cfg).run()
    error = app.state.server.scheduler.load_error
    if isinstance(error, MlxSpecError):
        raise error
    if error is not None:
        raise MlxSpecError(f"cannot load the model: {type(error).__name__}: {error}")
    return 0
