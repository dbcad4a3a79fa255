"""Native multi-token-prediction heads shipped inside the target's own checkpoint.

Two layouts (mlx-lm's loaders drop both, so they are read here from the safetensors themselves):
- Qwen3.5 / Qwen3.6 / Qwen3-Next (`mtp_num_hidden_layers`): `mtp.fc` [H, 2H],
  `mtp.pre_fc_norm_{embedding,hidden}`, `mtp.layers.0.*` (a full-attention decoder layer of the target's
  own kind) and `mtp.norm`. Hugging Face stores these norms zero-centred (weight + 1 is the scale).
- DeepSeek-V3 / GLM-4.5 / Kimi-K2 (`num_nextn_predict_layers`): `model.layers.{N}.*` past the
  N decoder layers: `enorm`, `hnorm`, `eh_proj` [H, 2H], a decoder block, `shared_head.norm` (its
  `shared_head.head` and `embed_tokens` are copies of the target's, which are used instead).

A step: fc([norm_e(emb(x_{t+1})) ; norm_h(h_t)]) -> the layer -> final norm -> the target's LM head,
predicting x_{t+2}. h_t is the target's last hidden state after its final norm (a tap on the last
layer, normed here with the target's own norm); chained steps read the head's normed output, the
same kind of vector. Several steps per round reuse the one head.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import DrafterMismatchError, LoadError
from ..model_files import read_config, safetensors_header, text_config
from ..target import FINAL_NORMS, find_layers
from .base import load_strict
from .chain import ChainDrafter, causal_mask, quantize_like

_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.(.*)$")
_QWEN = re.compile(r"^(?:model\.)?(?:language_model\.)?mtp\.(.*)$")


def mtp_format(config: dict) -> str | None:
    """'qwen', 'deepseek', or None when the config declares no MTP head."""
    tc = text_config(config)
    if (tc.get("mtp_num_hidden_layers") or 0) > 0:
        return "qwen"
    if (tc.get("num_nextn_predict_layers") or 0) > 0:
        return "deepseek"
    return None


def is_mtp_weight(name: str, config: dict) -> bool:
    """Whether a checkpoint tensor belongs to the MTP head (`mlx-spec convert` keeps these)."""
    if _QWEN.match(name):
        return True
    m = _LAYER.match(name)
    return bool(m) and mtp_format(config) == "deepseek" and int(m[1]) >= text_config(config)["num_hidden_layers"]


def _headers(path: Path) -> dict[str, tuple[Path, dict]]:
    """Every tensor of a folder's safetensors (all files: some checkpoints keep MTP in a file of its own)."""
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        header, _ = safetensors_header(f)
        out.update({k: (f, v) for k, v in header.items() if k != "__metadata__"})
    return out


def mtp_tensor_names(path: Path, config: dict | None = None) -> set[str]:
    """Names of the MTP tensors in a checkpoint folder, from the safetensors headers only."""
    config = read_config(path) if config is None else config
    if mtp_format(config) is None:
        return set()
    return {k for k in _headers(path) if is_mtp_weight(k, config)}


def has_mtp(path: Path) -> bool:
    """Whether a model folder carries MTP weights (headers only; cheap enough to ask at every load)."""
    try:
        return bool(mtp_tensor_names(path))
    except (LoadError, ValueError, OSError):
        return False


def is_mtp_only(config: dict, names: set[str]) -> bool:
    """A folder of MTP tensors only (a head split out of its model)."""
    return mtp_format(config) is not None and bool(names) and all(is_mtp_weight(n, config) for n in names)


def _hf_layout(headers: dict) -> bool:
    """Weights as Hugging Face wrote them (conv1d not yet transposed, as mlx-lm tells them apart), so
    the Qwen MTP norms are still zero-centred; an mlx-spec converted folder stores them shifted."""
    convs = [v["shape"] for k, (_, v) in headers.items() if k.endswith("conv1d.weight")]
    return not convs or convs[0][-1] != 1


class _Head(nn.Module):
    """norm_e, norm_h, fc and one decoder layer, under neutral names; `_names` maps checkpoint names."""

    def __init__(self, layer: nn.Module, hidden: int, eps: float):
        super().__init__()
        self.norm_e = nn.RMSNorm(hidden, eps=eps)
        self.norm_h = nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = layer
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def __call__(self, emb: mx.array, h: mx.array, cache) -> mx.array:
        x = self.fc(mx.concatenate([self.norm_e(emb), self.norm_h(h).astype(emb.dtype)], axis=-1))
        return self.norm(self.layer(x, causal_mask(x, cache), cache))


QWEN_NAMES = {"pre_fc_norm_embedding.": "norm_e.", "pre_fc_norm_hidden.": "norm_h.", "fc.": "fc.",
              "layers.0.": "layer.", "norm.": "norm."}
DEEPSEEK_NAMES = {"enorm.": "norm_e.", "hnorm.": "norm_h.", "eh_proj.": "fc.", "shared_head.norm.": "norm."}
SKIPPED = ("shared_head.head.", "embed_tokens.")  # copies of the target's own


class MTPDrafter(ChainDrafter):
    def __init__(self, head: _Head, target, block_size: int = 4):
        self.head, self._target, self.block_size = head, target, block_size
        self.tap_ids = (target.num_layers - 1,)
        owner, _, _ = find_layers(target.model)
        self._final_norm = next(owner[n] for n in FINAL_NORMS if isinstance(owner.get(n), nn.Module))

    def features(self, hidden: mx.array) -> mx.array:
        return self._final_norm(hidden)  # the tap is the last layer's output; h_t is after the final norm

    def step(self, g: mx.array, tokens: mx.array, cache) -> mx.array:
        return self.head(self._target.embed(tokens), g, cache)

    def logits(self, out: mx.array) -> mx.array:
        return self._target.lm_head(out)[0].astype(mx.float32)


def _target_layer(target, fmt: str, n_layers: int) -> tuple[nn.Module, object]:
    """A fresh decoder layer of the target's own class and settings: full attention, and (DeepSeek) of
    the kind layer N would be."""
    _, parent, layers = find_layers(target.model)
    args = getattr(parent, "args", None) or target.model.args
    layer_cls = type(getattr(layers[-1], "inner", layers[-1]))  # unwrapped from a tap
    index = args.full_attention_interval - 1 if fmt == "qwen" else n_layers
    return layer_cls(args, index), args


def _sanitize_block(target, block: dict[str, mx.array], n_layers: int) -> dict[str, mx.array]:
    """The decoder block's tensors through the target's own mlx-lm sanitize (stacked experts, MLA
    kv_b_proj split, fp8), as if they were those of its last layer."""
    j = n_layers - 1
    renamed = {f"model.layers.{j}.{k}": v for k, v in block.items()}
    out = {}
    for k, v in target.model.sanitize(renamed).items():
        m = _LAYER.match(k)
        if m and int(m[1]) == j:
            out[m[2]] = v
    return out


def load_mtp(path: Path, target, target_config: dict, block_size: int | None = None) -> MTPDrafter:
    """The MTP head in `path` (the target's own checkpoint, or a folder holding only the head)."""
    config = read_config(path)
    fmt = mtp_format(config)
    if fmt is None:
        raise DrafterMismatchError(f"{path} declares no MTP head (no mtp_num_hidden_layers or "
                                   f"num_nextn_predict_layers in its config)")
    tc, ttc = text_config(config), text_config(target_config)
    n = tc["num_hidden_layers"]
    headers = _headers(path)
    names = [k for k in headers if is_mtp_weight(k, config)]
    if not names:
        raise DrafterMismatchError(f"{path} has no MTP weights (mlx-lm's converter drops them: use the original "
                                   f"Hugging Face checkpoint, or one converted by mlx-spec convert)")
    problems = [f"{key} {tc.get(key)} != target's {ttc.get(key)}" for key in ("hidden_size", "vocab_size")
                if tc.get(key) != ttc.get(key)]
    if n != target.num_layers:
        problems.append(f"MTP head of a {n}-layer model, the target has {target.num_layers}")
    if fmt == "qwen" and tc["mtp_num_hidden_layers"] != 1:
        problems.append(f"mtp_num_hidden_layers {tc['mtp_num_hidden_layers']} (only 1 is supported)")
    if problems:
        raise DrafterMismatchError(f"MTP head in {path} does not fit the target: " + "; ".join(problems))
    weights = _read(headers, names)
    head_w, block = _split(weights, fmt, n)
    layer, args = _target_layer(target, fmt, n)
    block = _sanitize_block(target, block, n)
    weights = {**head_w, **{f"layer.{k}": v for k, v in block.items()}}
    if fmt == "qwen" and _hf_layout(headers):  # zero-centred RMSNorm weights: the scale is weight + 1
        weights = {k: v + 1.0 if "norm" in k and v.ndim == 1 else v for k, v in weights.items()}
    head = _Head(layer, args.hidden_size, args.rms_norm_eps)
    quantize_like(head, weights)
    load_strict(head, weights, path, "the target", what="MTP weights")
    return MTPDrafter(head, target, block_size or 4)


def _read(headers: dict, names: list[str]) -> dict[str, mx.array]:
    out, files = {}, {}
    for name in names:
        f = headers[name][0]
        if f not in files:
            files[f] = mx.load(str(f))  # lazy: only the MTP tensors are ever read
        out[name] = files[f][name]
    return out


def _split(weights: dict, fmt: str, n: int) -> tuple[dict, dict]:
    """(head tensors under _Head's names, the decoder block's tensors under layer-relative names)."""
    head, block = {}, {}
    renames = QWEN_NAMES if fmt == "qwen" else DEEPSEEK_NAMES
    for name, v in weights.items():
        rest = _QWEN.match(name)[1] if fmt == "qwen" else _LAYER.match(name)[2]
        if fmt == "deepseek" and int(_LAYER.match(name)[1]) != n:
            continue  # further MTP modules (depth 2, ...): the first one serves every step
        if rest.startswith(SKIPPED):
            continue
        for old, new in renames.items():
            if rest.startswith(old):
                if new == "layer.":
                    block[rest[len(old):]] = v
                else:
                    head[new + rest[len(old):]] = v
                break
        else:
            if fmt == "deepseek":
                block[rest] = v  # the decoder block's own tensors (self_attn, mlp, layer norms)
            else:
                raise LoadError(f"unexpected MTP tensor {name}")
    return head, block
