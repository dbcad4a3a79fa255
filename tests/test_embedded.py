"""The embedded default model: loads offline, decodes deterministically, matches mlx-lm."""

import subprocess

import mlx_lm
import pytest

import mlx_spec
from mlx_spec import models

VARIANTS = [models.DEFAULT_TARGET, models.DEFAULT_TARGET_8BIT]


@pytest.mark.parametrize("path", VARIANTS, ids=["float32", "8bit"])
def test_greedy_is_deterministic_and_matches_mlx_lm(path):
    model, tok = mlx_spec.load(str(path), drafter=None)
    ref_model, ref_tok = mlx_lm.load(str(path))
    for prompt in ["def fibonacci(n):", [{"role": "user", "content": "Hi! How are you today?"}]]:
        text = prompt if isinstance(prompt, str) else ref_tok.apply_chat_template(prompt, add_generation_prompt=True,
                                                                                  tokenize=False)
        ref = mlx_lm.generate(ref_model, ref_tok, text, max_tokens=48)
        runs = [mlx_spec.generate(model, tok, prompt, max_tokens=48) for _ in range(2)]
        assert runs[0] == runs[1] == ref


def test_default_load_is_the_embedded_model():
    model, tok = mlx_spec.load()
    assert model.target_path == models.DEFAULT_TARGET
    assert model.config["model_type"] == "qwen3" and tok.has_chat_template


def test_answers_code_prompt_with_python():
    model, tok = mlx_spec.load(drafter=None)
    reply = mlx_spec.generate(model, tok, [{"role": "user", "content": "Write a Python function `add(a, b)` that "
                                                                       "returns the sum of a and b."}], max_tokens=80)
    assert "def " in reply and ("return" in reply or ":" in reply)


def test_cli_generate_on_default_model():
    out = subprocess.run(["mlx-spec", "generate", "--prompt", "def add(a, b):", "--raw", "-m", "12"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("prompt: ") and "generation: 12 tokens" in last and "peak memory" in last


@pytest.mark.parametrize("mode", ["auto", "lookup"])
def test_embedded_speculation_is_lossless(mode):
    """The embedded target with its default drafter (auto) and with prompt lookup: greedy output as mlx-lm's."""
    model, tok = mlx_spec.load(mode=mode)
    assert model.drafter is not None
    ref_model, ref_tok = mlx_lm.load(str(models.DEFAULT_TARGET))
    for prompt in ["def fibonacci(n):", "import os\nimport sys\n\ndef main():"]:
        ref = [r.token for r in mlx_lm.stream_generate(ref_model, ref_tok, prompt, max_tokens=48)]
        got = [t for r in mlx_spec.stream_generate(model, tok, prompt, 48, block_size=6) for t in r.tokens]
        assert got == ref[: len(got)] and len(got) >= len(ref) - 1


def test_serve_and_chat_default_to_the_embedded_model():
    import openai
    from test_server_cli import start, wait_healthy

    proc, url = start()
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        assert client.models.list().data[0].id == "mlx-spec-default"
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi!"}], max_tokens=8)
        assert r.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(30)
    chat = subprocess.run(["mlx-spec", "chat", "--no-history", "--max-tokens", "8"], input="Hello!\n/model\n/bye\n",
                          capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr
    assert "default" in chat.stdout + chat.stderr
