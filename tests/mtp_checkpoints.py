"""Tiny checkpoints with native MTP heads, in the layouts the model makers publish (Hugging Face).

- Qwen3.5: the hybrid target from `archs`, written back in Hugging Face's layout (names under
  `model.language_model`, conv1d [C, 1, K], zero-centred norms) plus `mtp.*` tensors;
  `text_config.mtp_num_hidden_layers` 1.
- GLM-4.5 (the DeepSeek-V3 layout): `model.layers.{N}` past the N decoder layers (enorm, hnorm, eh_proj,
  shared_head, embed_tokens, a MoE block with per-expert tensors); `num_nextn_predict_layers` 1.
- DeepSeek-V3 itself (and Kimi-K2, `kimi_k2`, which mlx-lm maps to deepseek_v3): 61 decoder layers,
  as published, because mlx-lm's deepseek_v3 sanitize drops `model.layers.61` by that fixed name;
  narrow (hidden 32) so that the depth stays cheap. MLA attention in Hugging Face's form (`kv_b_proj`,
  which mlx-lm splits into `embed_q`/`unembed_out`), MoE from layer `first_k_dense_replace` on (here the
  last target layer and the MTP block, whose experts are stored one tensor each). `with_head` writes a
  loaded (fitted) head back into such a checkpoint in the same published form.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

import archs
import factory

NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
         ".k_norm.weight")  # the norms Hugging Face's Qwen3.5 stores zero-centred (scale = weight + 1)


def _write(out: Path, weights: dict, config: dict, tokenizer_dir: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_dir.glob("*token*"):
        shutil.copy(f, out / f.name)
    return out


def _normal(shape, scale):
    return mx.random.normal(shape) * scale


def qwen35(out: Path, tokenizer_dir: Path, seed: int = 0, mtp_seed: int = 5, layers: int = 4, scale: float = 4.0) -> Path:
    """A Qwen3.5 hybrid target with an MTP head, as Hugging Face publishes it."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    base = archs.make(out.with_name(out.name + "-mlx"), tokenizer_dir, "qwen3_5", layers=layers, seed=seed,
                      scale=scale)
    config = json.loads((base / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    weights = {}
    for k, v in mx.load(str(base / "model.safetensors")).items():
        if "conv1d.weight" in k:
            v = v.moveaxis(1, 2)  # mlx [C, K, 1] -> Hugging Face [C, 1, K]
        if k.endswith(NORMS) and v.ndim == 1:
            v = v - 1.0
        weights[k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")] = v
    tc = config["text_config"]
    args = TextModelArgs.from_dict(tc)
    mx.random.seed(mtp_seed)
    layer = DecoderLayer(args, args.full_attention_interval - 1)
    h = args.hidden_size
    for k, v in tree_flatten(layer.parameters()):
        weights[f"mtp.layers.0.{k}"] = v - 1.0 if k.endswith(NORMS) else v * scale if v.ndim == 2 else v
    weights["mtp.fc.weight"] = _normal((h, 2 * h), scale / (2 * h) ** 0.5)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        weights[f"mtp.{name}.weight"] = _normal((h,), 0.1)  # zero-centred: scales near 1
    return _write(out, weights, config, tokenizer_dir)


GLM = dict(model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], hidden_size=64, intermediate_size=128,
           moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_shared_experts=1,
           n_routed_experts=4, routed_scaling_factor=1.0, n_group=1, topk_group=1, num_experts_per_tok=2,
           first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6,
           rope_theta=10000.0, rope_scaling=None, use_qk_norm=True, tie_word_embeddings=False, attention_bias=True,
           partial_rotary_factor=0.5, num_nextn_predict_layers=1, eos_token_id=2)


def _hf_block(params: dict) -> dict:
    """A mlx-lm MoE layer's tensors as Hugging Face names them (one tensor per expert)."""
    out = {}
    for k, v in params.items():
        if ".switch_mlp." in k:
            for e in range(v.shape[0]):
                out[k.replace(".switch_mlp.", f".experts.{e}.")] = v[e]
        else:
            out[k] = v
    return out


def glm(out: Path, tokenizer_dir: Path, layers: int = 3, seed: int = 0, mtp_seed: int = 5) -> Path:
    """A GLM-4.5 (DeepSeek-V3-style MTP) target with its MTP module at model.layers.{layers}, as published:
    enorm, hnorm, eh_proj, shared_head.{norm,head}, embed_tokens and a MoE block with per-expert tensors."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.models import glm4_moe

    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**GLM, "num_hidden_layers": layers, "vocab_size": vocab}
    args = glm4_moe.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = glm4_moe.Model(args)
    scaled = lambda p: {k: v * 4.0 if v.ndim >= 2 else v for k, v in tree_flatten(p)}
    weights = _hf_block(scaled(model.parameters()))
    mx.random.seed(mtp_seed)
    n, h = layers, args.hidden_size
    _add_mtp_module(weights, n, h, _hf_block(scaled(glm4_moe.DecoderLayer(args, n).parameters())), 4.0)
    return _write(out, weights, config, tokenizer_dir)


def _add_mtp_module(weights: dict, n: int, h: int, block: dict, fc_scale: float) -> None:
    """The published MTP module at model.layers.{n}: its decoder block, eh_proj, the three norms, and the
    copies of the target's head and embedding (drawn in this order, after the block)."""
    weights.update({f"model.layers.{n}.{k}": v for k, v in block.items()})
    weights[f"model.layers.{n}.eh_proj.weight"] = _normal((h, 2 * h), fc_scale / (2 * h) ** 0.5)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"model.layers.{n}.{name}.weight"] = 1.0 + _normal((h,), 0.1)
    weights[f"model.layers.{n}.shared_head.head.weight"] = weights["lm_head.weight"]  # copies, as published
    weights[f"model.layers.{n}.embed_tokens.weight"] = weights["model.embed_tokens.weight"]


DEEPSEEK_V3 = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=32,
                   intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=61, num_attention_heads=2,
                   num_key_value_heads=2, n_shared_experts=1, n_routed_experts=4, routed_scaling_factor=2.5,
                   kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8,
                   topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, n_group=2, topk_group=1,
                   num_experts_per_tok=2, moe_layer_freq=1, first_k_dense_replace=60, max_position_embeddings=512,
                   rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
                   tie_word_embeddings=False, num_nextn_predict_layers=1, eos_token_id=2)


def _hf_mla(params: dict, heads: int, nope: int) -> dict:
    """mlx-lm's split MLA projections (embed_q [h, r, nope], unembed_out [h, v, r]) joined back into
    Hugging Face's kv_b_proj [h * (nope + v), r], the form its sanitize splits."""
    out = {}
    for k, v in params.items():
        if k.endswith("self_attn.embed_q.weight"):
            prefix = k[: -len("embed_q.weight")]
            wv = params[prefix + "unembed_out.weight"]
            kv_b = mx.concatenate([v.swapaxes(-1, -2), wv], axis=1)  # [h, nope + v, r]
            out[prefix + "kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
        elif not k.endswith("self_attn.unembed_out.weight"):
            out[k] = v
    return out


def deepseek_v3(out: Path, tokenizer_dir: Path, model_type: str = "deepseek_v3", seed: int = 0,
                mtp_seed: int = 5) -> Path:
    """A DeepSeek-V3 target (61 layers, MLA, MoE) with its MTP module at model.layers.61, as published:
    enorm, hnorm, eh_proj, shared_head.{norm,head}, embed_tokens and a MoE decoder block."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.models import deepseek_v3 as ds

    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**DEEPSEEK_V3, "model_type": model_type, "vocab_size": vocab}
    args = ds.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = ds.Model(args)
    scaled = lambda p: {k: v * 2.0 if v.ndim >= 2 and "embed_tokens" not in k else v for k, v in tree_flatten(p)}
    to_hf = lambda p: _hf_block(_hf_mla(scaled(p), args.num_attention_heads, args.qk_nope_head_dim))
    weights = to_hf(model.parameters())
    mx.random.seed(mtp_seed)
    n, h = args.num_hidden_layers, args.hidden_size
    _add_mtp_module(weights, n, h, to_hf(ds.DeepseekV3DecoderLayer(args, n).parameters()), 2.0)
    return _write(out, weights, config, tokenizer_dir)


HEAD_NAMES = {"norm_e.": "enorm.", "norm_h.": "hnorm.", "fc.": "eh_proj.", "norm.": "shared_head.norm."}


def with_head(src: Path, out: Path, head, model_type: str | None = None) -> Path:
    """`src` (a DeepSeek-V3-layout checkpoint) with its MTP module at model.layers.{N} replaced by a loaded
    (e.g. fitted) head, written back in the published form: mlx-lm's split MLA joined into kv_b_proj, experts
    one tensor each. The target's own tensors are copied unchanged; `model_type` retypes the config (Kimi-K2)."""
    config = json.loads((src / "config.json").read_text())
    n = config["num_hidden_layers"]
    flat = dict(tree_flatten(head.parameters()))
    layer = {k[len("layer."):]: v for k, v in flat.items() if k.startswith("layer.")}
    block = _hf_block(_hf_mla(layer, config["num_attention_heads"], config["qk_nope_head_dim"]))
    weights = dict(mx.load(str(src / "model.safetensors")))
    written = {f"model.layers.{n}.{k}" for k in block}
    written |= {f"model.layers.{n}.{new}weight" for new in HEAD_NAMES.values()}
    published = {k for k in weights if k.startswith(f"model.layers.{n}.") and "shared_head.head" not in k
                 and "embed_tokens" not in k}
    assert written == published, written ^ published  # the module's tensors, each rewritten, no others
    weights.update({f"model.layers.{n}.{k}": v for k, v in block.items()})
    for old, new in HEAD_NAMES.items():
        weights[f"model.layers.{n}.{new}weight"] = flat[f"{old}weight"]
    return _write(out, weights, {**config, "model_type": model_type or config["model_type"]}, src)


def converted(src: Path, out: Path, bits: int) -> Path:
    """What a converter that keeps the MTP head writes: the target in mlx layout, quantized, and the
    `mtp.*` tensors beside it with their norms already shifted (weight + 1), as the target's are."""
    if (out / "config.json").exists():
        return out
    from mlx_spec.drafters.mtp import is_mtp_weight

    factory.quantize(src, out, bits)
    config = json.loads((src / "config.json").read_text())
    weights = dict(mx.load(str(out / "model.safetensors")))
    for k, v in mx.load(str(src / "model.safetensors")).items():
        if is_mtp_weight(k, config):
            weights[k] = v + 1.0 if "norm" in k and v.ndim == 1 else v
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


def split(src: Path, out: Path, **config_edits) -> Path:
    """The MTP tensors alone in a folder of their own, with the model's config (as mlx-vlm's split does)."""
    from mlx_spec.drafters.mtp import is_mtp_weight

    config = json.loads((src / "config.json").read_text())
    weights = {k: v for k, v in mx.load(str(src / "model.safetensors")).items() if is_mtp_weight(k, config)}
    tc = config.get("text_config", config)
    tc.update(config_edits)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
