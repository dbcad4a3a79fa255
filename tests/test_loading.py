"""Loading: local folders, repo ids through an offline HF cache, precisions, and clear errors."""

import json
import os
import shutil
import subprocess
import sys

import mlx.core as mx
import pytest

import factory
import mlx_spec
from mlx_spec.errors import DrafterMismatchError, LoadError


def test_local_folder_and_dtypes(target_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=None)
    assert model.drafter is None and model.context_length == 512
    assert model.model.model.embed_tokens.weight.dtype == mx.float32
    bf16, _ = mlx_spec.load(str(target_dir), drafter=None, dtype="bfloat16")
    assert bf16.model.model.embed_tokens.weight.dtype == mx.bfloat16
    assert mlx_spec.generate(bf16, tok, "def add(a, b):", max_tokens=5)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_folder(target_dir, models_dir, bits):
    qdir = factory.quantize(target_dir, models_dir / f"load-q{bits}", bits=bits)
    model, tok = mlx_spec.load(str(qdir), drafter=None)
    assert json.loads((qdir / "config.json").read_text())["quantization"]["bits"] == bits
    assert "QuantizedLinear" in type(model.model.layers[0].self_attn.q_proj).__name__
    assert len(mlx_spec.generate(model, tok, "Hello", max_tokens=5)) > 0


def hf_cache(root, repo, src):
    """A hand-built Hugging Face cache: hub/models--org--name/{refs/main, snapshots/<sha>/...}."""
    org, name = repo.split("/")
    base = root / "hub" / f"models--{org}--{name}"
    sha = "0123456789abcdef0123456789abcdef01234567"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(sha)
    shutil.copytree(src, base / "snapshots" / sha)


def run_offline(hf_home, code):
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_repo_id_offline_through_hf_cache(tmp_path, target_dir, drafter_dir):
    hf_cache(tmp_path, "tiny-org/tiny-target", target_dir)
    hf_cache(tmp_path, "tiny-org/tiny-target-DFlash", drafter_dir)
    out = run_offline(tmp_path, (
        "import mlx_spec\n"
        "m, t = mlx_spec.load('tiny-org/tiny-target', drafter='tiny-org/tiny-target-DFlash')\n"
        "print(m.target_path, m.drafter_path)\n"
        "print(len(mlx_spec.generate(m, t, 'Hello', max_tokens=4)) > 0)\n"
    ))
    assert out.returncode == 0, out.stderr
    assert "snapshots" in out.stdout and out.stdout.strip().endswith("True")
    missing = run_offline(tmp_path, "import mlx_spec\nmlx_spec.load('tiny-org/absent', drafter=None)")
    assert missing.returncode != 0 and "cannot find model tiny-org/absent" in missing.stderr


def broken_copy(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def truncate(d):
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def corrupt_header(d):
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"not json !!!"
    f.write_bytes(bytes(data))


def unknown_arch(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "no_such_arch"
    (d / "config.json").write_text(json.dumps(cfg))


def small_vocab(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 100
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("edit, message", [
    (truncate, "corrupt or truncated"),
    (corrupt_header, "corrupt or truncated"),
    (unknown_arch, "unknown architecture 'no_such_arch'"),
    (small_vocab, "cannot load weights"),
    (lambda d: (d / "config.json").unlink(), "has no config.json"),
    (lambda d: (d / "model.safetensors").unlink(), "has no .safetensors"),
])
def test_bad_target_gives_one_clear_error(tmp_path, target_dir, edit, message):
    bad = broken_copy(target_dir, tmp_path / "bad", edit)
    with pytest.raises(LoadError, match=message):
        mlx_spec.load(str(bad), drafter=None)


def test_tokenizer_mismatch(tmp_path, target_dir, models_dir):
    big_tok = factory.make_tokenizer(models_dir / "big-tok", vocab_size=400)
    bad = broken_copy(target_dir, tmp_path / "bad", lambda d: [shutil.copy(f, d / f.name) for f in big_tok.iterdir()])
    with pytest.raises(LoadError, match=r"tokenizer .* has \d+ tokens but the model.s vocab_size is 320"):
        mlx_spec.load(str(bad), drafter=None)


def test_missing_path():
    with pytest.raises(LoadError, match="no model folder at /no/such/dir"):
        mlx_spec.load("/no/such/dir")


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_size=32), "hidden size 32 != target's 64"),
    (dict(target_layer_ids=[1, 9]), r"target_layer_ids \[9\] out of range"),
    (dict(num_target_layers=12), "trained for a 12-layer target"),
    (dict(vocab_size=1000), "vocabulary 1000 != target's"),
    (dict(mask_token_id=99999), "mask_token_id 99999 is not a token"),
])
def test_mismatched_drafter_is_refused(tmp_path, target_dir, overrides, message):
    d = factory.make_drafter(tmp_path / "d", target_dir)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in overrides.items():
        (cfg["dflash_config"] if k in ("target_layer_ids", "mask_token_id") else cfg)[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterMismatchError, match=message):
        mlx_spec.load(str(target_dir), drafter=str(d))


def test_other_checkpoint_kinds_are_refused(tmp_path, target_dir, drafter_dir):
    relabelled = broken_copy(drafter_dir, tmp_path / "dspark", lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()), "architectures": ["Qwen3DSparkModel"]})))
    with pytest.raises(DrafterMismatchError, match="weights do not match its config .Missing .*embed_tokens"):
        mlx_spec.load(str(target_dir), drafter=str(relabelled))
    dspark = factory.make_dspark(tmp_path / "real-dspark", target_dir)
    with pytest.raises(DrafterMismatchError, match="is a DSpark drafter, not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(dspark), mode="dflash")
    dflash2 = broken_copy(drafter_dir, tmp_path / "dflash2", lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()), "architectures": ["DFlash2DraftModel"]})))
    # Labelled DFlash 2 but without its conv and selector tensors: refused by the DFlash 2 loader.
    with pytest.raises(DrafterMismatchError, match="weights do not match its config"):
        mlx_spec.load(str(target_dir), drafter=str(dflash2))
    with pytest.raises(DrafterMismatchError, match="is a DFlash 2 drafter, not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(dflash2), mode="dflash")
    with pytest.raises(DrafterMismatchError, match="is a plain language model .a draft model., not what --mode dflash expects"):
        mlx_spec.load(str(target_dir), drafter=str(target_dir), mode="dflash")


def test_cli_error_is_one_line(tmp_path):
    out = subprocess.run(["mlx-spec", "generate", "--model", str(tmp_path / "nope"), "-m", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error: no model folder")
