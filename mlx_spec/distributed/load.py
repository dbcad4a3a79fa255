"""Load one rank's share of a target: its own decoder layers (plus the embedding, final norm and head,
which every stage keeps, as mlx-lm's pipeline does), never the whole model; the drafter on rank 0."""

from __future__ import annotations

import json

import mlx.core as mx

from .. import models as registry_pkg
from ..errors import LoadError, MlxSpecError
from ..drafters.mtp import has_mtp
from ..loading import Loaded, find_drafter, lay_out
from ..model_files import check_safetensors, read_config, resolve, safetensors_header, text_config, weight_files
from .drafting import SharedDrafter
from .layout import Layout
from .session import DistributedError, Session
from .stage import PipelineTarget


def fingerprint(path, drafter_path=None) -> str:
    """The target's (and drafter's) config and tensor headers: equal text, equal weights, for all a
    header can tell (names, dtypes, shapes, byte ranges, file sizes) without reading any weights."""
    parts = [(path / "config.json").read_text()]
    for f in weight_files(path):
        header, _ = safetensors_header(f)
        parts.append(f"{f.name}:{f.stat().st_size}:{json.dumps(header, sort_keys=True)}")
    if drafter_path is not None and (drafter_path / "config.json").exists():
        parts.append((drafter_path / "config.json").read_text())
        parts += [f"{f.name}:{f.stat().st_size}" for f in weight_files(drafter_path)]
    return "\n".join(parts)


def versions() -> str:
    import mlx_lm

    from .. import __version__

    return f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, mlx-spec {__version__}"


class _OneRank:
    """A one-rank group for mlx-lm's `pipeline()`: it keeps every (local) layer, sends nothing, and
    recomputes the layer indices its masks come from (Qwen3.5: the first linear and attention layers)."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def load_stage(path, layout_for, dtype: str | None = None):
    """The model with only this rank's decoder layers, loaded lazily so that the other layers'
    tensors are never read from disk; and its tokenizer and config."""
    from mlx_lm.utils import load_model, load_tokenizer

    from ..target import find_layers

    check_safetensors(path)
    try:
        model, config = load_model(path, lazy=True)
    except Exception as e:  # mlx-lm raises many kinds; all mean "this folder does not load"
        raise LoadError(f"cannot load {path}: {type(e).__name__}: {str(e)[:200]}") from None
    owner, _, layers = find_layers(model)
    layout = layout_for(len(layers))
    owner.layers = layers[layout.start : layout.end]  # the others' tensors stay unread, then are dropped
    del layers
    if callable(getattr(owner, "pipeline", None)):
        owner.pipeline(_OneRank())  # mlx-lm's own bookkeeping of which local layer makes which mask (hybrids)
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return model, tokenizer, config, layout


def load_distributed(session: Session, target=None, drafter="auto", *, mode: str = "auto", dtype: str | None = None,
                     block_size: int | None = None, eval_every: int | None = None):
    """`loading.load` for one rank of a distributed run: (Loaded, tokenizer), the same on every rank
    except for the layers held and the drafter (rank 0's)."""
    from ..drafters import load_drafter
    from ..kernels import KernelConfig

    ref = str(target) if target is not None else str(registry_pkg.DEFAULT_TARGET)
    path = resolve(ref)
    read_config(path)
    mode = "off" if drafter is None and mode == "auto" else mode
    drafter_path = None
    if mode not in ("off", "lookup"):
        drafter_path = find_drafter(ref, path) if drafter == "auto" else resolve(drafter)
        if drafter == "auto" and (mode == "mtp" or (mode == "auto" and drafter_path is None and has_mtp(path))):
            # native MTP, as `loading.load` picks it: the head reads the last layer's hidden state, which
            # is rank 0's own (the last stage), so it drafts there like any drafter; only rank 0 reads it
            drafter_path, mode = path, "mtp"
    session.check_same("versions", versions())
    session.check_same("weights (config.json or safetensors headers differ)",
                       fingerprint(path, drafter_path) + f"\nmode={mode} block={block_size} dtype={dtype}")
    split = session.config.split
    model, tokenizer, config, layout = load_stage(path, lambda n: Layout(n, session.size, session.rank, split), dtype)
    if eval_every is None:
        eval_every = 2 if mx.default_device() == mx.cpu else 0
    vocab = int(text_config(config).get("vocab_size") or 0)
    wrapped = PipelineTarget(model, layout, session.group, vocab, kernels=KernelConfig(enabled=False),
                             eval_every=eval_every)
    shared = _drafter_on_root(session, lambda: load_drafter(mode, drafter_path, wrapped, config, block_size))
    if shared is not None:
        wrapped.check_speculation()
        wrapped.set_taps(shared.tap_ids)
    relaid = lay_out(model, shared)
    session.barrier()
    return Loaded(wrapped, shared, path, drafter_path, config, relaid=relaid), tokenizer


def _drafter_on_root(session: Session, load):
    """Rank 0 loads the drafter and tells the others its block size and taps (or that it failed)."""
    inner, facts = None, None
    if session.is_root:
        try:
            inner = load()
            facts = [1, 0, 0] if inner is None else [1, inner.block_size, len(inner.tap_ids)]
        except MlxSpecError as e:  # rank 0 raises it; the others must not wait for a drafter
            facts, failure = [0, 0, 0], e
    ok, block, n_taps = session.share_ints(facts, 3)
    if not ok:
        if session.is_root:
            raise failure
        raise DistributedError("rank 0 could not load the drafter (see rank 0's error)")
    if block == 0:
        return None
    taps = session.share_ints(list(inner.tap_ids) if session.is_root else None, n_taps) if n_taps else []
    return SharedDrafter(inner, session.group, block, tuple(taps))
