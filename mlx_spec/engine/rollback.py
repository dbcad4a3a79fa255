"""What each cache type can give back, and how: the one place that knows the cache types.

- plain KV caches drop any number of newest rows;
- sliding windows (SpecRotatingKVCache) drop as many as they keep beyond the window (`max_trim`);
- recurrent/conv states (RecurrentCache) undo their latest update, and the accepted part of it
  is replayed (`trim` returns how many tokens; PromptCache feeds them);
- any of them can be put back to a checkpoint (`snapshot`/`restore`), which is how prefix reuse
  reaches back further than a trim can.
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache, CacheList, ConcatenateKVCache, KVCache, QuantizedKVCache, \
    RotatingKVCache, make_prompt_cache

from ..errors import MlxSpecError
from .recurrent import RecurrentCache
from .rotating import SpecRotatingKVCache
from .slab import RowKVCache

# Architectures whose recurrent layers were checked to write their state as whole new arrays and to call
# `cache.advance(S)` (what RecurrentCache relies on), with greedy-identity tests (tests/test_hybrid.py).
# Other architectures with recurrent state decode plainly but are refused for speculation.
RECURRENT_TESTED = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_next", "nemotron_h", "falcon_h1", "lfm2", "lfm2_moe",
                              "granitemoehybrid", "kimi_linear", "mamba2", "plamo2", "olmo_hybrid",
                              "bailing_hybrid", "bailing_moe_v3", "gear", "kimi_k3"})
# Why the other architectures mlx-lm 0.32 ships with recurrent or convolutional state are refused (checked in
# their code); any other one is refused as untested.
NOT_ADVANCED = "its recurrent layers never call cache.advance, which marks where a state update ends"
REFUSED = {
    "mamba": NOT_ADVANCED, "jamba": NOT_ADVANCED, "rwkv7": NOT_ADVANCED, "recurrent_gemma": NOT_ADVANCED,
    "bailing_moe_linear": NOT_ADVANCED,
    "baichuan_m1": "its convolution state is a list written in place (cache[0][i] = ...), which a checkpoint "
                   "by reference cannot keep",
    "longcat_flash_ngram": "its n-gram context cache (the last tokens, which its embedding reads) is written without "
                           "cache.advance, which marks where a state update ends",
}

# Architectures whose layers cannot take a right-padded batch of requests exactly: their rounds verify one
# request at a time (engine.loop.verify).
UNBATCHED = {
    "minimax_m3_vl": "its block-sparse indexer places a block's queries at the end of the padded key width, "
                     "so a shorter row's local blocks would be chosen wrongly",
}

UNBOUNDED = 1 << 60  # a plain KV cache can go back to any earlier token
PLAIN_KV = (KVCache, RowKVCache, QuantizedKVCache, ConcatenateKVCache)


def spec_caches(caches: list, slack: int = 0, kv_bits: int | None = None, kv_group_size: int = 64) -> list:
    """mlx-lm's caches, with sliding windows and recurrent states swapped for ones that roll back exactly
    and plain KV caches for ones that batch without copies (RowKVCache); with kv_bits, full-attention KV
    caches quantized from the first token (mlx-lm's QuantizedKVCache)."""
    def swap(c):
        if type(c) is RotatingKVCache and c.keep == 0:
            return SpecRotatingKVCache.like(c, slack)
        if type(c) is ArraysCache:
            return RecurrentCache.like(c)
        if type(c) is KVCache:  # (RowKVCache: batched rounds keep its rows in a slab, engine/slab.py)
            return QuantizedKVCache(group_size=kv_group_size, bits=kv_bits) if kv_bits else RowKVCache()
        if isinstance(c, CacheList):
            return CacheList(*(swap(x) for x in c.caches))
        return c

    return [swap(c) for c in caches]


def leaves(caches: list) -> list:
    out = []
    for c in caches:
        out += leaves(list(c.caches)) if isinstance(c, CacheList) else [c]
    return out


def attention_spans(caches: list) -> list[int]:
    """The most cached rows each attention layer's cache holds for a query to read (0: every row);
    recurrent states, a fixed size whatever the context, are left out."""
    return [c.max_size if isinstance(c, RotatingKVCache) else 0 for c in leaves(caches)
            if isinstance(c, (RotatingKVCache, *PLAIN_KV))]


def can_roll_back(c) -> bool:
    return type(c) in PLAIN_KV or isinstance(c, (SpecRotatingKVCache, RecurrentCache))


def architecture(model) -> str:
    return type(model).__module__.rsplit(".", 1)[-1]


def batchable(model) -> bool:
    """Whether several requests' blocks may share one verify pass of this model (see UNBATCHED)."""
    return architecture(model) not in UNBATCHED


def speculation_problem(model, caches: list | None = None) -> str | None:
    """Why speculative decoding cannot run exactly on this model (None: it can)."""
    caches = spec_caches(make_prompt_cache(model)) if caches is None else caches
    arch = architecture(model)
    bad = {type(c).__name__ for c in leaves(caches) if not can_roll_back(c)}
    if bad:
        return f"{arch}: {', '.join(sorted(bad))} cannot roll back"
    if any(isinstance(c, RecurrentCache) for c in leaves(caches)) and arch not in RECURRENT_TESTED:
        return f"{arch}: {REFUSED.get(arch, 'rollback of its recurrent state is not supported yet (untested)')}"
    return None


def make_cache(model, rollback: bool = True, kv_bits: int | None = None, kv_group_size: int = 64) -> list:
    """The target's prompt cache. Speculation needs every layer able to roll back; plain decoding does not."""
    caches = spec_caches(make_prompt_cache(model), kv_bits=kv_bits, kv_group_size=kv_group_size)
    problem = speculation_problem(model, caches) if rollback else None
    if problem:
        raise MlxSpecError(f"speculative decoding is not supported on {problem}; plain decoding works (drafter=None)")
    return caches


def max_trim(c) -> int:
    """How many newest rows a cache can drop and be exactly as it was back then."""
    if isinstance(c, CacheList):
        return min(max_trim(x) for x in c.caches)
    if type(c) in PLAIN_KV:
        return UNBOUNDED
    own = getattr(c, "max_trim", None)
    return own() if own is not None else 0


def rewindable(caches: list) -> int:
    """How many newest tokens `trim` can take back exactly, by trimming or by rewind + replay."""
    flat = leaves(caches)
    rec = [c for c in flat if isinstance(c, RecurrentCache)]
    if not rec:
        return min((max_trim(c) for c in flat), default=UNBOUNDED)
    last = min(c.last_n if c._before is not None else 0 for c in rec)
    return last if all(max_trim(c) >= last for c in flat if not isinstance(c, RecurrentCache)) else 0


def trim(caches: list, n: int) -> int:
    """Take back the newest n tokens. Returns how many tokens before them the recurrent states must be fed
    again (0 without recurrent layers): a recurrent state goes back to before its latest update, every
    other layer drops the n tokens, and the caller replays the kept part of that update to the recurrent
    layers (PromptCache.add; a replay through the whole stack first calls `drop_kept` so that every layer
    takes those tokens again)."""
    if n <= 0:
        return 0
    flat = leaves(caches)
    replay = 0
    for c in flat:
        if isinstance(c, RecurrentCache):
            replay = c.rewind(n)
    for c in flat:
        if not isinstance(c, RecurrentCache):
            c.trim(n)
    return replay


def drop_kept(caches: list, n: int) -> None:
    """Before a pass through the whole stack replays n tokens: the layers that kept them drop them too."""
    for c in leaves(caches):
        if not isinstance(c, RecurrentCache):
            c.trim(n)


def pending(caches: list) -> int:
    """Tokens rewound and waiting to be replayed."""
    return max((c.pending for c in leaves(caches) if isinstance(c, RecurrentCache)), default=0)


def replayed(caches: list) -> None:
    for c in leaves(caches):
        if isinstance(c, RecurrentCache):
            c.pending = 0


def snapshot(caches: list) -> list:
    """A checkpoint of every layer, by reference (no copies): plain KV layers just note their length."""
    return [c.snapshot() if hasattr(c, "snapshot") else c.offset for c in leaves(caches)]


def restore(caches: list, snap: list) -> None:
    for c, s in zip(leaves(caches), snap):
        if hasattr(c, "restore"):
            c.restore(s)
        else:  # rows before the checkpoint are untouched: later writes only went past it
            c.trim(c.offset - s)

