"""`mlx-spec convert`: a Hugging Face checkpoint (folder or repo id) to an MLX folder that keeps its drafter.

The target goes through mlx-lm's own `convert` (its sanitize, dtype and quantization). mlx-lm drops
the native MTP head's tensors, so they are copied from the original shards into `mtp.safetensors`
beside the model (mlx-lm reads only `model*.safetensors`, the MTP loader reads every file). A separate
drafter (`--drafter`) is written to `OUT/drafter`. Target and drafter are quantized apart
(`--q-bits`, `--drafter-q-bits`). Drafter weights never become float16: float16 drafter activations
overflow and cost acceptance (users saw 0 % on M1/M2), so with a float16 target they are kept float32.
A user registry entry then lets `--mode auto` find a separate drafter for the converted target.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx

DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(p) -> None:
    p.add_argument("model", help="Hugging Face checkpoint folder or repo id")
    p.add_argument("--out", "-o", type=Path, required=True, help="the MLX folder to write (must not exist)")
    p.add_argument("--drafter", default=None, help="a drafter checkpoint (DFlash, DFlash 2, DSpark, EAGLE-3) to convert beside it")
    p.add_argument("--q-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8), help="quantize the target")
    p.add_argument("--drafter-q-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
                   help="quantize the drafter (the MTP head or --drafter) apart from the target")
    p.add_argument("--q-group-size", type=int, default=64)
    p.add_argument("--dtype", choices=DTYPES, default=None, help="target dtype (default: the checkpoint's)")
    p.add_argument("--drafter-dtype", choices=DTYPES, default=None,
                   help="drafter weights (default: the checkpoint's, float32 where it would be float16)")
    p.add_argument("--no-register", action="store_true", help="do not add the pair to the user registry")


def run(args) -> int:
    from ..errors import MlxSpecError

    if args.out.exists():
        raise MlxSpecError(f"{args.out} already exists; choose a new folder")
    out = convert(args.model, args.out, drafter=args.drafter, q_bits=args.q_bits, drafter_q_bits=args.drafter_q_bits,
                  group_size=args.q_group_size, dtype=args.dtype, drafter_dtype=args.drafter_dtype,
                  register=not args.no_register)
    print(f"wrote {out}")
    return 0


def convert(model: str, out: Path, drafter: str | None = None, q_bits: int | None = None,
            drafter_q_bits: int | None = None, group_size: int = 64, dtype: str | None = None,
            drafter_dtype: str | None = None, register: bool = True) -> Path:
    from mlx_lm import convert as mlx_lm_convert

    from ..model_files import read_config, resolve

    src = resolve(model)
    config = read_config(src)
    mlx_lm_convert(str(src), str(out), quantize=q_bits is not None, q_bits=q_bits,
                   q_group_size=group_size if q_bits else None, dtype=dtype)
    target_dtype = dtype or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    ddtype = drafter_dtype or ("float32" if target_dtype == "float16" else None)
    mtp = mtp_weights(src, config)
    if mtp:
        if _qwen_mtp(config) and _hf_layout(src) and not _hf_layout(out):
            # mlx-lm shifted the target's zero-centred norms (conv1d transposed tells the loaders so);
            # the MTP head's, kept from the HF shards, must be shifted alike.
            mtp = {k: v + 1.0 if "norm" in k and v.ndim == 1 else v for k, v in mtp.items()}
        mx.save_safetensors(str(out / "mtp.safetensors"), _prepare(mtp, ddtype, drafter_q_bits, group_size),
                            metadata={"format": "mlx"})
    drafter_out = None
    if drafter is not None:
        drafter_out = convert_drafter(resolve(drafter), out / "drafter", ddtype, drafter_q_bits, group_size)
    if register and drafter_out is not None:
        from ..drafters import checkpoint_kind
        from ..loading import register_pair

        register_pair(out, drafter_out, checkpoint_kind(drafter_out))
    return out


def mtp_weights(src: Path, config: dict) -> dict:
    """The MTP head's tensors from the original shards (lazily loaded; only these are read)."""
    from ..model_files import safetensors_header

    try:
        from ..drafters.mtp import is_mtp_weight
    except ImportError:  # the MTP drafter not installed yet: the published name patterns (formats.md (d))
        is_mtp_weight = _is_mtp_weight
    out = {}
    for f in sorted(src.glob("*.safetensors")):
        names = [k for k in safetensors_header(f)[0] if k != "__metadata__" and is_mtp_weight(k, config)]
        if names:
            weights = mx.load(str(f))
            out.update({k: weights[k] for k in names})
    return out


def _is_mtp_weight(name: str, config: dict) -> bool:
    import re

    tc = {**config, **config.get("text_config", {})}
    if tc.get("mtp_num_hidden_layers"):
        return re.match(r"^(model\.)?(language_model\.)?mtp\.", name) is not None
    m = re.match(r"^model\.layers\.(\d+)\.", name)
    return bool(tc.get("num_nextn_predict_layers")) and bool(m) and int(m[1]) >= tc["num_hidden_layers"]


def _qwen_mtp(config: dict) -> bool:
    return bool({**config, **config.get("text_config", {})}.get("mtp_num_hidden_layers"))


def _hf_layout(folder: Path) -> bool:
    """Weights as Hugging Face writes them: conv1d kernels not yet transposed to mlx's [C, K, 1] (the rule
    mlx-lm's qwen3_5 sanitize and mlx_spec.drafters.mtp use to tell whether norms are zero-centred)."""
    from ..model_files import safetensors_header

    for f in sorted(folder.glob("*.safetensors")):
        for k, v in safetensors_header(f)[0].items():
            if k.endswith("conv1d.weight"):
                return v["shape"][-1] != 1
    return True


def _prepare(weights: dict, dtype: str | None, bits: int | None, group_size: int) -> dict:
    """Cast floating weights to `dtype` (float16 never: it becomes float32) and quantize the matrices."""
    out = {}
    for k, v in weights.items():
        if mx.issubdtype(v.dtype, mx.floating):
            if dtype is not None:
                v = v.astype(getattr(mx, dtype))
            elif v.dtype == mx.float16:
                v = v.astype(mx.float32)
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if bits and base and v.ndim == 2 and "norm" not in k and v.shape[-1] % group_size == 0:
            w, scales, biases = mx.quantize(v, group_size=group_size, bits=bits)
            out.update({k: w, f"{base}.scales": scales, f"{base}.biases": biases})
        else:
            out[k] = v
    return out


def convert_drafter(src: Path, out: Path, dtype: str | None, bits: int | None, group_size: int) -> Path:
    from ..model_files import read_config, weight_files

    config = read_config(src)
    if config.get("quantization") and bits:
        from ..errors import MlxSpecError

        raise MlxSpecError(f"{src} is quantized already; convert it without --drafter-q-bits")
    out.mkdir(parents=True)
    weights = {}
    for f in weight_files(src):
        weights.update(mx.load(str(f)))
    weights = _prepare(weights, dtype, bits, group_size)
    if bits:
        config = {**config, "quantization": {"group_size": group_size, "bits": bits}}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for f in src.glob("*token*"):  # draft models carry a tokenizer; block drafters have none
        shutil.copy(f, out / f.name)
    return out
