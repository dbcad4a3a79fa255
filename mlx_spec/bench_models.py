"""Random models for measuring rollback: a Qwen3.5-shaped hybrid (3 Gated DeltaNet : 1 attention) and a
dense qwen3 of the same width and depth, with oracle drafters at a fixed acceptance.

`mlx-spec bench --rollback` runs `rollback_bench`: plain vs speculative decoding on both models at 0%,
50% and 100% acceptance, with the rollback cost per round (the replay passes, timed) and the cost the
alternative — recording a state per step during verify — would add to every verify pass.
Built with mlx-lm's own classes and saved in the on-disk format users load; the tokenizer is the
embedded target's.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from .drafters.base import Draft

WIDTH = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=2048,
             tie_word_embeddings=True)
QWEN35 = dict(model_type="qwen3_5", text_config=dict(
    model_type="qwen3_5_text", **WIDTH, linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_conv_kernel_dim=4, full_attention_interval=4,
    rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default")))
DENSE = dict(model_type="qwen3", **WIDTH, rope_theta=10000.0)


def random_model(config: dict, seed: int = 0, scale: float = 4.0):
    """mlx-lm's model for `config` with random weights, the 2-D ones scaled up so that logits are peaked,
    like a trained model's."""
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    return model


def save_model(model, config: dict, tokenizer_dir: Path, out: Path) -> Path:
    """`model` in the on-disk format users load, with the tokenizer files of `tokenizer_dir`."""
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_dir.glob("*token*"):
        shutil.copy(f, out / f.name)
    return out


def build(out: Path, config: dict, seed: int = 0, scale: float = 4.0) -> Path:
    """A random-weight model of `config` in the on-disk format; weights scaled up so that logits are
    peaked, like a trained model's."""
    from .models import DEFAULT_TARGET

    if (out / "config.json").exists():
        return out
    vocab = json.loads((DEFAULT_TARGET / "config.json").read_text())["vocab_size"]
    config = {**config, "vocab_size": vocab, "architectures": ["RandomForBench"], "eos_token_id": 2}
    if "text_config" in config:
        config["text_config"] = {**config["text_config"], "vocab_size": vocab}
    return save_model(random_model(config, seed, scale), config, DEFAULT_TARGET, out)


class PositionDrafter:
    """The bookkeeping of a drafter that drafts from a known continuation: its state is the absolute
    position reached (observed tokens count it up, a trim counts it back), no target features read."""

    tap_ids = ()

    class State:
        def __init__(self):
            self.offset = 0

        def trim(self, n):
            self.offset -= n
            return n

    def make_state(self):
        return self.State()

    def observe(self, state, hidden, tokens):
        state.offset += len(tokens)


class FixedAcceptance(PositionDrafter):
    """Drafts the true continuation with exactly the first ceil(rate * k) of k drafts right (the rest
    wrong), so every round accepts that fraction: `truth[i]` is the token at absolute position i."""

    def __init__(self, truth: list[int], rate: float, block_size: int = 8, vocab: int = 4096):
        self.truth, self.rate, self.block_size, self.vocab = truth, rate, block_size, vocab

    def propose(self, state, anchor, k, sampling):
        right = math.ceil(self.rate * k)
        out = []
        for i, pos in enumerate(range(state.offset + 1, state.offset + 1 + k)):
            good = self.truth[pos] if pos < len(self.truth) else 0
            out.append(good if i < right else (good + 1) % self.vocab)
        return Draft(mx.array(out, dtype=mx.int32))


def replay_cost(model, width: int, prompt_len: int = 64, repeats: int = 5) -> dict[int, float] | None:
    """Seconds of one rollback by replay, per number of kept tokens n = 1 … width − 1, on the loaded target,
    the way the loop does it: a verify pass of `width` tokens, the rewind, then the replay of the n kept
    tokens (timed; from the recorded mixer inputs where the layout allows). None when the target has no
    recurrent state: nothing is ever replayed."""
    from .engine.cache import PromptCache, replay
    from .engine.recurrent import RecurrentCache
    from .engine.rollback import leaves, restore, snapshot, trim

    pc = PromptCache(model.target.model, None)
    if not any(isinstance(c, RecurrentCache) for c in leaves(pc.cache)):
        return None
    tokens = [(7 * i) % 1000 + 3 for i in range(prompt_len + width)]
    model.target.model(mx.array([tokens[:prompt_len]]), cache=pc.cache)
    mx.eval([c.state for c in leaves(pc.cache)])
    snap = snapshot(pc.cache)
    out = {}
    for n in range(1, width):
        best = float("inf")
        for _ in range(repeats):
            restore(pc.cache, snap)
            mx.eval(model.target.model(mx.array([tokens[prompt_len : prompt_len + width]]), cache=pc.cache))
            trim(pc.cache, width - n)
            t = time.perf_counter()
            replay([pc], [tokens[prompt_len : prompt_len + n]])
            mx.eval([c.state for c in leaves(pc.cache)])
            best = min(best, time.perf_counter() - t)
        out[n] = best
    restore(pc.cache, snap)
    return out


def recording_cost(model, width: int, repeats: int = 5) -> float | None:
    """Seconds a verify pass of `width` tokens would spend on recording a state per step in the Gated
    DeltaNet layers, the alternative to replay: each layer's recurrence run one step at a time, every
    state kept, minus the whole-block recurrence the loaded mixers run now. None without Gated DeltaNet layers."""
    from .metal_kernels.gated_delta_verify import gated_delta_update  # what the loaded mixers run (kernels.py)

    layers = [m for _, m in model.target.model.named_modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not layers:
        return None
    g = layers[0]
    hk, dk, hv, dv = g.num_k_heads, g.head_k_dim, g.num_v_heads, g.head_v_dim
    q, k = (mx.random.normal((1, width, hk, dk)) * 0.1 for _ in range(2))
    v, a, b = mx.random.normal((1, width, hv, dv)), mx.random.normal((1, width, hv)), mx.random.normal((1, width, hv))
    state = mx.zeros((1, hv, dv, dk))

    def fused():
        return gated_delta_update(q, k, v, a, b, g.A_log, g.dt_bias, state)[1]

    def recorded():
        states, s = [], state
        for t in range(width):
            _, s = gated_delta_update(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], a[:, t : t + 1],
                                      b[:, t : t + 1], g.A_log, g.dt_bias, s)
            states.append(s)
        return mx.stack(states)

    def best(fn):
        mx.eval(fn())
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            mx.eval(fn())
            times.append(time.perf_counter() - t)
        return min(times)

    return max(0.0, best(recorded) - best(fused)) * len(layers)


def _decode(model, tok, prompt, tokens: int, block: int | None):
    """Decode tokens/s (prefill excluded), the output and the run's stats."""
    from .generate import stream_generate

    out = []
    for r in stream_generate(model, tok, prompt, max_tokens=tokens, block_size=block):
        out += r.tokens
    return r.generation_tps, out, r.spec


def mlx_lm_recurrence(model) -> None:
    """Give a loaded target's Gated DeltaNet mixers back their mlx-lm class (mlx-lm's `gated_delta_ops`
    loop off Metal): the "before" of kernels.patch_recurrence, for a side-by-side row. Before any prompt cache
    is made (recording mixers subclass whatever class a mixer has then)."""
    from .kernels import RECURRENCE_SWAPS, swap_classes

    swap_classes(model.target.model, {ours: base for base, ours in RECURRENCE_SWAPS.items()})


def rollback_bench(workdir: Path, block: int = 8, tokens: int = 64, repeats: int = 3,
                   rates=(0.0, 0.5, 1.0), with_mlx_lm_recurrence: bool = True) -> list[dict]:
    """Plain and speculative decoding of the Qwen3.5-shaped hybrid and a dense model of its size, with
    drafters accepting a fixed fraction of each block; rows also carry the rollback cost per round.

    The models take turns within each repeat (hybrid plain, hybrid spec, dense plain, dense spec, ...), so
    that load on a shared machine hits them alike; `vs_dense` is the median over repeats of the hybrid's
    speedup over the dense model's in the same repeat (the goal: >= 0.9 at 100%). With
    `with_mlx_lm_recurrence`, the hybrid also runs with mlx-lm's own recurrence (kernels.patch_recurrence
    undone), side by side."""
    from .engine.cache import PromptCache
    from .loading import load

    prompt = "def add(a, b):\n    return a + b\n"
    names = [("qwen3.5-shaped", QWEN35), ("dense qwen3", DENSE)]
    if with_mlx_lm_recurrence:
        names.insert(1, ("qwen3.5-shaped, mlx-lm recurrence", QWEN35))
    runs = []
    for name, config in names:
        model, tok = load(str(build(Path(workdir) / name.split(",")[0].split()[-1], config)), drafter=None)
        if "mlx-lm recurrence" in name:
            mlx_lm_recurrence(model)
        _decode(model, tok, prompt, 8, None)  # warm-up
        _, truth, _ = _decode(model, tok, prompt, tokens + block, None)
        runs.append(dict(name=name, model=model, tok=tok, truth=truth, ids=tok.encode(prompt),
                         record=recording_cost(model, block)))
    # the same floats: the hybrid's plain greedy output is the same with either recurrence
    agree = len({tuple(r["truth"]) for r in runs if r["name"].startswith("qwen3.5-shaped")}) == 1
    rows = []
    for rate in rates:
        pairs = {r["name"]: [] for r in runs}  # (plain tok/s, spec tok/s, output, stats) per repeat
        drafters = {r["name"]: FixedAcceptance(r["ids"] + r["truth"], rate, block, vocab=r["model"].config["vocab_size"])
                    for r in runs}
        for _ in range(repeats):
            for r in runs:
                model = r["model"]
                model.drafter = None
                plain = _decode(model, r["tok"], prompt, tokens, None)[0]
                model.drafter = drafters[r["name"]]
                pairs[r["name"]].append((plain, *_decode(model, r["tok"], prompt, tokens, block)))
        dense = [p[1] / p[0] for p in pairs["dense qwen3"]]
        for r in runs:
            model, ps = r["model"], pairs[r["name"]]
            spec = ps[-1][3]
            model.drafter = drafters[r["name"]]
            PromptCache.replay_seconds = 0.0  # one more run, timing its replay passes
            _decode(model, r["tok"], prompt, tokens, block)
            replay_ms = PromptCache.replay_seconds * 1e3 / max(1, spec.rounds)
            PromptCache.replay_seconds = None
            model.drafter = None
            speedups = [p[1] / p[0] for p in ps]
            rows.append(dict(model=r["name"], acceptance=rate, plain_tps=statistics.median(p[0] for p in ps),
                             spec_tps=statistics.median(p[1] for p in ps), speedup=statistics.median(speedups),
                             vs_dense=statistics.median(a / b for a, b in zip(speedups, dense)),
                             tau=spec.tau, rounds=spec.rounds,
                             identical=all(p[2] == r["truth"][: len(p[2])] for p in ps)
                             and (agree or r["name"] == "dense qwen3"),
                             rollback_ms_per_round=replay_ms,
                             recording_ms_per_round=None if r["record"] is None else r["record"] * 1e3))
    order = [r["name"] for r in runs]
    return sorted(rows, key=lambda row: (order.index(row["model"]), row["acceptance"]))
