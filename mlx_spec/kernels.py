"""Where the custom Metal kernels are used, and where their plain-MLX twins run.

On Metal each call shape is settled once by a quick on-device race between the
twin and the kernel variants (a kernel must agree with the twin and be faster);
the choice is cached in ~/.cache/mlx-spec/kernels.json, keyed by device, MLX
version, shape and dtype. Everywhere else, or with `enabled=False`
(`--no-kernels`), the twins run, and the results are bit-identical to mlx-lm's;
but on the CPU, passes of several rows (verify blocks, prompt chunks, a batch's one-token rows) take
a base-2 softmax (cpu_attention.py) and SiLU (cpu_swiglu.py), the same up to float rounding, unless
`--no-kernels`.

`patch_recurrence` (below) is applied on every backend, kernels on or off: on the CPU a verify block's
Gated DeltaNet recurrence runs as one compiled graph, bit-identical to mlx-lm's loop; elsewhere (Metal:
mlx-lm's own kernel) the call goes to mlx-lm unchanged.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen3

from mlx_spec import cpu_attention
from mlx_spec.cpu_swiglu import MLP_SWAPS
from mlx_spec.metal_kernels import fused_accept as _acc
from mlx_spec.metal_kernels import gated_delta_verify as _gdv
from mlx_spec.metal_kernels import qmm_mma as _mma
from mlx_spec.metal_kernels import qmm_rows as _rows
from mlx_spec.metal_kernels import verify_attention as _attn
from mlx_spec.target import retyped

DEFAULT_CACHE = Path.home() / ".cache" / "mlx-spec" / "kernels.json"
_TOL = {mx.float32: 1e-3, mx.float16: 1e-2, mx.bfloat16: 3e-2}


@dataclass
class KernelConfig:
    """Kernel use for one engine. `force` names the variant to use without a race
    ("ref", "kernel", "rows", "mma"); `make_kernel` builds a kernel from a
    `KernelSpec` (default: the Metal kernel; tests pass a simulator)."""

    enabled: bool = True
    race: bool = True
    cache_file: Optional[Path] = None
    force: Optional[str] = None
    make_kernel: Optional[Callable] = None
    _choices: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _loaded: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def active(self) -> bool:
        return self.enabled and (self.make_kernel is not None or metal_available())

    @property
    def on_cpu(self) -> bool:
        """Passes of several rows may take the CPU's own formulations (cpu_attention.py, cpu_swiglu.py)."""
        return self.enabled and mx.default_device() == mx.cpu

    @contextmanager
    def paused(self):
        """Every patched layer runs mlx-lm's own body for a while: a baseline run as mlx-lm runs it."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def kernel(self, spec):
        return self.make_kernel(spec) if self.make_kernel else spec.metal()


def metal_available() -> bool:
    return mx.metal.is_available() and mx.default_device().type == mx.gpu


def _device_name() -> str:
    try:
        info = mx.device_info()
        return f"{info.get('device_name', '?')}/{info.get('architecture', '?')}"
    except Exception:
        return "unknown"


# ---------------------------------------------------------------- selection
def _cache_path(config: KernelConfig) -> Path:
    return Path(config.cache_file) if config.cache_file else DEFAULT_CACHE


def _load(config: KernelConfig) -> None:
    if config._loaded:
        return
    config._loaded = True
    try:
        config._choices.update(json.loads(_cache_path(config).read_text()))
    except (OSError, ValueError):
        pass


def _save(config: KernelConfig) -> None:
    path = _cache_path(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(config._choices, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs a race per process


def _time(fn, reps: int = 7) -> float:
    for _ in range(2):
        mx.eval(fn())
    mx.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _close(out, ref) -> bool:
    outs, refs = (out, ref) if isinstance(out, (tuple, list)) else ((out,), (ref,))
    for a, b in zip(outs, refs):
        if a.shape != b.shape:
            return False
        if mx.issubdtype(b.dtype, mx.integer):
            if not mx.array_equal(a, b).item():
                return False
        else:
            a, b32 = a.astype(mx.float32), b.astype(mx.float32)
            tol = _TOL.get(b.dtype, 1e-3) * (mx.abs(b32).max().item() + 1.0)
            if not mx.abs(a - b32).max().item() <= tol:
                return False
    return True


def _race(candidates: dict) -> str:
    ref = candidates["ref"]()
    mx.eval(ref)
    times = {"ref": _time(candidates["ref"])}
    for name, fn in candidates.items():
        if name == "ref":
            continue
        try:
            out = fn()
            mx.eval(out)
            if _close(out, ref):  # a wrong answer never wins
                times[name] = _time(fn)
        except Exception:
            pass
    best = min(times, key=times.get)
    # a kernel has to win clearly: timing noise must not flip choices
    return best if best == "ref" or times[best] < 0.95 * times["ref"] else "ref"


def select(config: KernelConfig, key: tuple, candidates: dict) -> str:
    """The variant to run for `key` ('ref' is the twin); races once per key."""
    if not config.active:
        return "ref"
    if config.force:
        if config.force == "kernel":  # the widest variant offered for this shape
            return list(candidates)[-1]
        return config.force if config.force in candidates else "ref"
    k = "|".join([_device_name(), mx.__version__, *map(str, key)])
    _load(config)
    if k not in config._choices:
        if not config.race:
            return "ref"
        config._choices[k] = _race(candidates)
        _save(config)
    return config._choices[k] if config._choices[k] in candidates else "ref"


# ---------------------------------------------------------------- entry points
def fused_accept(logits: mx.array, draft_tokens: mx.array, config: Optional[KernelConfig] = None):
    """Greedy verify outcome (target_argmax (M,), accepted_len (), bonus ()), int32,
    without a host sync: read all three together, once per round."""
    config = config or KernelConfig(enabled=False)
    logits = logits.reshape(-1, logits.shape[-1])
    draft = draft_tokens.reshape(-1)
    cands = {"ref": lambda: _acc.fused_accept_ref(logits, draft)}
    if config.active:
        kern = config.kernel(_acc.SPEC)
        cands["kernel"] = lambda: _acc.fused_accept(logits, draft, kernel=kern)
    key = ("accept", logits.shape, logits.dtype)
    return cands[select(config, key, cands)]()


def _attn_split(s: int) -> int:
    return 128 if s <= 2048 else 256


def verify_attention(queries, keys, values, *, scale: float, mask="causal", config: Optional[KernelConfig] = None):
    """SDPA of a verify block: queries (B, Hq, L, D) at the last L positions of keys/values (B, Hkv, S, D),
    causal (or a boolean mask). Same result as `mx.fast.scaled_dot_product_attention`; the Metal kernel
    serves causal blocks of 2 <= L <= 16, the CPU's base-2 softmax (cpu_attention.py) long contexts and
    prompt chunks."""
    config = config or KernelConfig(enabled=False)
    if config.on_cpu and not config.active:  # (a simulated kernel in the tests is active on the CPU)
        return cpu_attention.sdpa(queries, keys, values, scale=scale, mask=mask)
    if not (isinstance(mask, str) and mask == "causal"):
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    cands = {"ref": lambda: _attn.verify_attention_ref(queries, keys, values, scale=scale)}
    L, S = queries.shape[2], keys.shape[2]
    if config.active and 2 <= L <= 16 and S >= L and queries.shape[-1] <= 256:
        kerns = (config.kernel(_attn.PARTIAL_SPEC), config.kernel(_attn.MERGE_SPEC))
        cands["kernel"] = lambda: _attn.verify_attention(
            queries, keys, values, scale=scale, split=_attn_split(S), kernels=kerns)
    # one race per power-of-two KV length: S grows every round
    bucket = 1 << max(S - 1, 1).bit_length()
    key = ("attn", queries.shape[:3], keys.shape[1], bucket, queries.shape[3], queries.dtype)
    return cands[select(config, key, cands)]()


def quantized_matmul(x, w, scales, biases, *, group_size: int, bits: int,
                     config: Optional[KernelConfig] = None):
    """`x @ dequantize(w).T` (affine mode); the kernels serve 2 <= rows <= 32."""
    config = config or KernelConfig(enabled=False)
    cands = {"ref": lambda: _rows.quantized_matmul_ref(x, w, scales, biases,
                                                       group_size=group_size, bits=bits)}
    m = x.size // x.shape[-1]
    if (config.active and 2 <= m <= 32 and bits in (4, 8) and group_size in (32, 64, 128)
            and biases is not None):
        kw = dict(group_size=group_size, bits=bits)
        rows_k = config.kernel(_rows.SPEC)
        cands["rows"] = lambda: _rows.qmm_rows(x, w, scales, biases, kernel=rows_k, **kw)
        if m >= 8:
            mma_k = config.kernel(_mma.SPEC)
            cands["mma"] = lambda: _mma.qmm_mma(x, w, scales, biases, kernel=mma_k, **kw)
    key = ("qmm", m, x.shape[-1], w.shape[0], bits, group_size, x.dtype, scales.dtype)
    return cands[select(config, key, cands)]()


# ---------------------------------------------------------------- model patching
class VerifyQuantizedLinear(nn.QuantizedLinear):
    """`nn.QuantizedLinear` whose matmul goes through `quantized_matmul` above."""

    def __call__(self, x):
        if self.mode != "affine":
            return super().__call__(x)
        y = quantized_matmul(x, self["weight"], self["scales"], self.get("biases"),
                             group_size=self.group_size, bits=self.bits,
                             config=self._kernel_config)
        if "bias" in self:
            y = y + self["bias"]
        return y


class VerifyQuantizedEmbedding(nn.QuantizedEmbedding):
    """`nn.QuantizedEmbedding` whose tied-head `as_linear` uses `quantized_matmul`."""

    def as_linear(self, x):
        if self.mode != "affine":
            return super().as_linear(x)
        return quantized_matmul(x, self["weight"], self["scales"], self.get("biases"),
                                group_size=self.group_size, bits=self.bits,
                                config=self._kernel_config)


class _VerifyAttention:
    """The mlx-lm qwen3/llama attention body with the verify-block SDPA (and on the CPU a prompt chunk's)
    routed through `verify_attention`; anything else (one-token passes) runs the original body."""

    def __call__(self, x, mask=None, cache=None):
        B, L, _ = x.shape
        cfg = self._kernel_config
        plain_cache = cache is not None and not hasattr(cache, "bits")
        causal = isinstance(mask, str) and mask == "causal"
        block = 2 <= L <= 16 and ((cfg.active and causal) or cfg.on_cpu)
        cpu = cfg.on_cpu and not cfg.active
        # On the CPU, also a prompt chunk, and a batch's one-token rows (alone, a one-token pass stays mlx-lm's
        # own: plain decoding matches mlx-lm's with it); mx.fast's masked batch there was 2.5x the time.
        prompt, rows = cpu and L > 16, cpu and L == 1 and B > 1
        if not (plain_cache and (block or prompt or rows)):
            return super().__call__(x, mask=mask, cache=cache)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.reshape(B, L, self.n_heads, -1), k.reshape(B, L, self.n_kv_heads, -1)
        if "q_norm" in self:  # qwen3 normalises heads before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = verify_attention(q, k, v, scale=self.scale, mask=mask, config=cfg)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class VerifyQwen3Attention(_VerifyAttention, qwen3.Attention):
    pass


class VerifyLlamaAttention(_VerifyAttention, llama.Attention):
    pass


ATTENTION_SWAPS = {qwen3.Attention: VerifyQwen3Attention, llama.Attention: VerifyLlamaAttention}
CPU_SWAPS = {**ATTENTION_SWAPS, **MLP_SWAPS}  # on the CPU, without Metal kernels: exp in base 2
SWAPS = {nn.QuantizedLinear: VerifyQuantizedLinear, nn.QuantizedEmbedding: VerifyQuantizedEmbedding, **ATTENTION_SWAPS}


def _substitute(cls, layer, config):
    new = retyped(layer, cls)
    new._kernel_config = config
    return new


def patch_model(model: nn.Module, config: KernelConfig, swaps: dict = SWAPS) -> nn.Module:
    """Swap the model's quantized layers and qwen3/llama attention modules (or those of `swaps`) for
    the dispatching subclasses above (in place; exact classes only, so models with other attention
    bodies keep theirs). Returns the model."""
    found = [(path, m) for path, m in model.named_modules() if path and type(m) in swaps]
    # children first, so a substituted parent holds the substituted children
    for path, m in sorted(found, key=lambda pm: -pm[0].count(".")):
        *parents, last = path.split(".")
        parent = model
        for p in parents:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        new = _substitute(swaps[type(m)], m, config)
        if isinstance(parent, list):
            parent[int(last)] = new
        else:
            parent.update_modules({last: new})
    return model


# ---------------------------------------------------------------- recurrent mixers (every backend)
def _recurrence_call(cls):
    """mlx-lm's own `cls.__call__` body, with its one global name `gated_delta_update` bound to ours.

    The function is rebuilt from mlx-lm's code object with a copy of its module's globals: mlx-lm's module
    and class are untouched, and the mixer runs mlx-lm's code line for line (no copied body to drift from
    it), only the recurrence routed through `_gdv.gated_delta_update`, which gives the same floats."""
    fn = cls.__call__
    if "gated_delta_update" not in fn.__code__.co_names:
        raise TypeError(f"{cls.__qualname__}.__call__ no longer calls gated_delta_update")
    scope = {**fn.__globals__, "gated_delta_update": _gdv.gated_delta_update}
    call = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    call.__kwdefaults__, call.__doc__ = fn.__kwdefaults__, fn.__doc__
    return call


def _recurrence_swaps() -> dict:
    from mlx_lm.models import olmo_hybrid, qwen3_5, qwen3_next

    bases = (qwen3_5.GatedDeltaNet, qwen3_next.Qwen3NextGatedDeltaNet, olmo_hybrid.GatedDeltaNet)
    swaps = {}
    for b in bases:  # VerifyQwen3_5GatedDeltaNet, VerifyQwen3_NextQwen3NextGatedDeltaNet, ...
        name = f"Verify{b.__module__.rsplit('.', 1)[-1].title()}{b.__name__}"
        swaps[b] = type(name, (b,), {"__call__": _recurrence_call(b), "__module__": __name__})
    return swaps


RECURRENCE_SWAPS = _recurrence_swaps()


def patch_recurrence(model: nn.Module) -> nn.Module:
    """Swap the model's Gated DeltaNet mixers (qwen3_5, qwen3_5_moe, qwen3_next, olmo_hybrid) for subclasses
    whose verify-width recurrence on the CPU is one compiled graph (`metal_kernels/gated_delta_verify.py`;
    bit-identical to mlx-lm's `gated_delta_ops`; other backends keep mlx-lm's call). Applied on every
    backend, with or without kernels; the recording mixers of engine/recurrent.py subclass these in turn.
    Returns the model."""
    return swap_classes(model, RECURRENCE_SWAPS)


def swap_classes(model: nn.Module, classes: dict) -> nn.Module:
    """Every child module whose exact class is a key of `classes` becomes an instance of its value, with the
    same parameters, children and attributes (in place). Returns the model."""
    for _, layer in model.named_modules():
        for name, child in list(layer.children().items()):
            if isinstance(child, nn.Module) and type(child) in classes:
                layer.update_modules({name: retyped(child, classes[type(child)])})
    return model
