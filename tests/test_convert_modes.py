"""`mlx-spec convert` output in every mode it can serve: a target converted with each kind of separate
drafter (DFlash, DFlash 2, DSpark, EAGLE-3), quantized or not, apart or together, loads in that mode (and
in auto, through the user registry) and decodes as mlx-lm does; the same folder serves lookup and plain
decoding; repo ids resolve through a hand-built Hugging Face cache (offline), MTP head and drafter at once."""

import json
import os
import subprocess
import sys

import pytest

import drafter_checks as checks
import factory
import mlx_spec
from drafter_checks import plain
from mlx_spec.cli import main
from mlx_spec.drafters import model_drafter
from test_dflash2 import make_dflash2
from test_eagle3 import make_eagle3
from test_lossless_greedy import PROMPTS, spec
from test_loading import hf_cache

KINDS = {"dflash": "DFlashDrafter", "dflash2": "DFlash2Drafter", "dspark": "DSparkDrafter", "eagle3": "Eagle3Drafter",
         "mtp": "MTPDrafter", "lookup": "LookupDrafter"}


@pytest.fixture(autouse=True)
def user_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def make(kind, models_dir, target_dir):
    out = models_dir / f"convert-src-{kind}"
    if out.exists():
        return out
    if kind == "dflash":
        return factory.make_drafter(out, target_dir)
    if kind == "dflash2":
        return make_dflash2(out, target_dir, taps=(0, 2), block_size=6)
    if kind == "dspark":
        return factory.make_dspark(out, target_dir)
    return make_eagle3(out, target_dir, layout="speculators", aux_ids=[2, 3, 4], draft_vocab=200)


REPEATS = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print("  # lookup finds earlier n-grams


def check_runs(out, mode, n=16):
    """Loads in `mode` with the expected drafter and decodes greedily as mlx-lm does at two block sizes."""
    model, tok = mlx_spec.load(str(out), mode=mode, block_size=6)
    assert type(model_drafter(model.drafter)).__name__ == KINDS[mode], mode
    prompts = [REPEATS] if mode == "lookup" else PROMPTS[:1]
    checks.assert_greedy_identity(model, tok, out, prompts, (2, 5), mode, n=n)


@pytest.mark.parametrize("kind, flags", [
    ("dflash", ["--q-bits", "8"]),
    ("dflash2", ["--q-bits", "4"]),
    ("dspark", ["--q-bits", "8", "--drafter-q-bits", "8"]),
    ("eagle3", ["--q-bits", "4", "--drafter-q-bits", "8"]),
])
def test_each_drafter_kind_runs_after_convert(kind, flags, models_dir, target_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["convert", str(target_dir), "--out", str(out), "--q-group-size", "32", *flags,
                 "--drafter", str(make(kind, models_dir, target_dir))]) == 0
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == int(flags[1])
    drafter_bits = json.loads((out / "drafter" / "config.json").read_text()).get("quantization", {}).get("bits")
    assert drafter_bits == (8 if "--drafter-q-bits" in flags else None)
    model, _ = mlx_spec.load(str(out))  # auto: the registered pair
    assert type(model_drafter(model.drafter)).__name__ == KINDS[kind] and model.drafter_path == out / "drafter"
    check_runs(out, kind)
    if kind == "dflash":  # the same folder, no model drafter: prompt lookup, and plain decoding
        check_runs(out, "lookup")
        model, tok = mlx_spec.load(str(out), mode="off")
        assert model.drafter is None
        assert spec(model, tok, PROMPTS[0], 12)[0] == plain(out, PROMPTS[0], 12)


def test_repo_ids_through_the_hf_cache(models_dir, tokenizer_dir, target_dir, tmp_path, user_registry):
    """Offline, in one process: repo ids for a Hugging Face target with its MTP head (served by --mode mtp
    and, with nothing registered, auto), and for a target plus a DSpark drafter (auto: the registered pair)."""
    import mtp_checkpoints

    hf = mtp_checkpoints.qwen35(models_dir / "mtp-qwen35", tokenizer_dir)
    hf_cache(tmp_path / "hf", "tiny-org/Qwen3.5-tiny", hf)
    hf_cache(tmp_path / "hf", "tiny-org/Qwen3-tiny", target_dir)
    hf_cache(tmp_path / "hf", "tiny-org/Qwen3-tiny-DSpark", make("dspark", models_dir, target_dir))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "XDG_DATA_HOME": str(user_registry)}
    env.pop("HF_HUB_CACHE", None)
    mtp_out, pair_out = tmp_path / "mtp", tmp_path / "pair"
    code = ("import sys; from mlx_spec.cli import main\n"
            f"a = main(['convert', 'tiny-org/Qwen3.5-tiny', '--out', {str(mtp_out)!r}, '--q-bits', '8',"
            " '--q-group-size', '32', '--drafter-q-bits', '8'])\n"
            f"b = main(['convert', 'tiny-org/Qwen3-tiny', '--out', {str(pair_out)!r}, '--drafter',"
            " 'tiny-org/Qwen3-tiny-DSpark', '--drafter-q-bits', '8', '--q-group-size', '32'])\n"
            "sys.exit(a or b)")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (mtp_out / "mtp.safetensors").exists() and (pair_out / "drafter" / "model.safetensors").exists()
    assert type(model_drafter(mlx_spec.load(str(mtp_out))[0].drafter)).__name__ == "MTPDrafter"
    check_runs(mtp_out, "mtp")
    assert type(model_drafter(mlx_spec.load(str(pair_out))[0].drafter)).__name__ == "DSparkDrafter"
    check_runs(pair_out, "dspark")
