"""DSpark (vanilla Markov head, confidence truncation) against mlx-dspark 0.20.3, on the same weights:
its own loop (`mlx_dspark.generate.speculative_generate` with its `load_target` / `load_drafter`) and
mlx-spec's drafted the same number of tokens (where the confidence head's survival product cut the
block) and accepted the same number in every round, greedy.

No published mlx-dspark (0.1.0 to 0.20.3, checked 0.1.0, 0.5.0, 0.10.0, 0.15.0, 0.18.0, 0.20.0, 0.20.3)
implements DeepSpec's gated or RNN Markov heads (only `VanillaMarkov`; a checkpoint with their tensors
fails its strict load), nor does mlx-vlm 0.7.10 ("DSpark currently supports only
markov_head_type='vanilla'"), so those two heads are checked against DeepSpec's equations in numpy
(tests/test_dspark_heads.py). mlx-dspark pulls mlx-vlm and more, so it is not in the test environment:
run this in a venv that has it (`python -m venv --system-site-packages /work/venvs/dspark &&
/work/venvs/dspark/bin/pip install mlx-dspark==0.20.3`, then `/work/venvs/dspark/bin/python -m pytest -q
tests/test_reference_mlx_dspark.py`); without it the test is skipped with that reason.
"""

import pytest

import factory
import mlx_spec
from test_lossless_greedy import PROMPTS

generate = pytest.importorskip("mlx_dspark.generate", reason="mlx-dspark is not installed (heavy: run in a venv "
                               "with `pip install mlx-dspark==0.20.3`, see this file's docstring) - the cross-check needs it")
from mlx_dspark.load import load_drafter, load_target  # noqa: E402

THRESHOLD = 0.2


def test_rounds_equal_mlx_dspark(models_dir, target_dir):
    path = factory.make_dspark(models_dir / "dspark-xcheck", target_dir, threshold=THRESHOLD)
    ref_target, ref_tok = load_target(str(target_dir), require_tap=True)
    ref_drafter, _ = load_drafter(str(path), quantize=False)  # strict: every tensor name matched
    model, tok = mlx_spec.load(str(target_dir), drafter=str(path))
    assert model.drafter.rule == "survival" and ref_drafter.max_draft == model.drafter.block_size - 1 == 5
    cut = accepted = 0
    for prompt in PROMPTS:
        theirs = []
        res = generate.speculative_generate(
            ref_target, ref_tok, ref_drafter, prompt_ids=tok.encode(prompt), max_new_tokens=40,
            confidence_threshold=THRESHOLD, max_draft_tokens=None, lookup_drafts=False, temperature=0.0,
            apply_chat_template=False, on_round=lambda **r: theirs.append((r["drafted"], r["accepted"])))
        rounds = list(mlx_spec.stream_generate(model, tok, prompt, max_tokens=40, block_size=6))
        assert [t for r in rounds for t in r.tokens] == res.token_ids[: sum(len(r.tokens) for r in rounds)], prompt
        ours = [(r.drafted, r.accepted) for r in rounds[1:]]  # the first response is the prefill's token
        # Rounds while a whole block fits in max_tokens (past that the loops size the last drafts differently).
        done = [sum(len(r.tokens) for r in rounds[: i + 1]) for i in range(len(rounds))]
        n = min(len(theirs), sum(d + 6 <= 40 for d in done[:-1]))
        assert ours[:n] == theirs[:n], prompt
        cut += sum(d < 5 for d, _ in theirs[:n])
        accepted += sum(a for _, a in theirs[:n])
    assert cut > 10 and accepted > 0, (cut, accepted)  # truncation decided rounds; some drafts accepted


def test_bench_side_by_side_with_mlx_dspark_dflash(target_dir, drafter_dir):
    """`bench --vs-dspark`: its DFlash loop on the same files gives the same greedy tokens, and both rates
    count alike (the tokens after the first, over the time after it)."""
    from mlx_spec.bench_dspark import compare

    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    rows = compare(model, tok, {"code": PROMPTS[:2]}, [1, 3], max_tokens=24, repeats=1)
    (row,) = rows
    assert row["outputs_differ"] == 0 and row["pairs"] == 2
    assert set(row["dspark_tps_by_cap"]) == {1, 3} and row["dspark_best_cap"] in (1, 3)
    assert 0 < row["ratio_vs_best_e2e"] and 0 < row["ratio_vs_best"]
