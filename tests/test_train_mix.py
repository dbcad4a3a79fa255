"""The long-context recipe (issue #19): the corpus mix and its held-out split, 2,048-token target
training with a reused tokenizer, raw prompts and the target's quality measures (the drafter's losses and
sliding window: tests/test_drafter_losses.py). Small, fast fixtures: a fake stdlib, docs and chit-chat."""

import dataclasses
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_spec
from mlx_spec.train import corpus, mix
from mlx_spec.train.data import encode, read_prompts
from mlx_spec.train.evaluate import measure
from mlx_spec.train.target import TargetTrainConfig, batch_at, prepare_data, validation
from mlx_spec.train.target_eval import distinct_ngrams
from mlx_spec.train.tokenizer import render_chat

FUNC = '''
def helper_{i}(x, y={i}):
    """Return x plus {i} times y."""
    total = x
    for _ in range({i}):
        total = total + y
    return total
'''


@pytest.fixture()
def fake_sources(tmp_path, monkeypatch):
    lib, docs = tmp_path / "lib", tmp_path / "docs"
    for m in range(12):
        (lib / f"pkg{m}").mkdir(parents=True)
        body = "\n".join(textwrap.dedent(FUNC.format(i=m * 10 + i)) for i in range(30))
        (lib / f"pkg{m}" / "mod.py").write_text(f'"""Module {m}."""\nimport os\n\n' + body)
    (lib / "test").mkdir()
    (lib / "test" / "skipped.py").write_text("def f():\n    pass\n")
    docs.mkdir()
    for d in range(4):
        (docs / f"page{d}.rst.txt").write_text(f"Page {d}\n======\n\n" + "Some words about Python. " * 50)
    rng = random.Random(0)
    words = "hello there how are you today fine thanks what about the weather it is sunny".split()
    talks = [[{"role": ("user", "assistant")[t % 2], "content": " ".join(rng.choices(words, k=60))}
              for t in range(6)] for _ in range(80)]
    monkeypatch.setattr(corpus, "chitchat_chats", lambda: iter(talks))  # the real one needs chitchat-dataset
    return corpus.CorpusConfig(stdlib=lib, docs=docs, max_chats=20, max_code_chats=50,
                               long_code_chats=30, long_chats=10, held_out_fraction=0.25)


def test_held_out_is_stable_by_source():
    keys = [f"py:m{i}.py" for i in range(2000)]
    picked = [k for k in keys if corpus.held_out(k, 0.02)]
    assert 15 <= len(picked) <= 65  # about 2 %
    assert picked == [k for k in keys[::-1] if corpus.held_out(k, 0.02)][::-1]  # order does not matter
    assert not any(corpus.held_out(k, 0.0) for k in keys) and all(corpus.held_out(k, 1.0) for k in keys)


def test_long_mix_documents(fake_sources):
    docs = corpus.keyed_documents(fake_sources, render_chat)
    kinds = {k for _, k, _ in docs}
    assert kinds == {"code", "docs", "chat", "code-chat", "long-code-chat", "long-chat"}
    assert not any("skipped" in key for key, _, _ in docs)
    long_code = [t for _, k, t in docs if k == "long-code-chat"]
    assert len(long_code) == 30
    for text in long_code:
        user, answer = text.split("<|im_start|>assistant\n")
        body = answer.split("```python\n")[1].split("\n```")[0]
        excerpt = user.split("```python\n")[1].split("\n```")[0]
        assert len(excerpt) <= 5000
        copy = "again" in user or "Show me" in user or "Quote" in user
        assert (body in excerpt) == copy  # copy: the answer is in the excerpt; next: it follows it
    for _, k, text in docs:
        if k == "long-chat":
            roles = [line.split("<|im_start|>")[1] for line in text.splitlines() if line.startswith("<|im_start|>")]
            assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:])) and len(text) >= 6000
    # the shipped recipe's documents do not change when the long mix is off
    plain = corpus.CorpusConfig(stdlib=fake_sources.stdlib, docs=fake_sources.docs, max_chats=20, max_code_chats=50)
    assert corpus.documents(plain, render_chat) == [(k, t) for _, k, t in corpus.keyed_documents(plain, render_chat)]
    assert {k for k, _ in corpus.documents(plain, render_chat)} == {"code", "docs", "chat", "code-chat"}


def test_source_split_and_reused_tokenizer(fake_sources, tmp_path):
    tok_src = Path(mlx_spec.__file__).parent / "models" / "default" / "target"
    cfg = TargetTrainConfig(out=tmp_path / "run", split="source", val_fraction=0.25, tokenizer_from=tok_src,
                            corpus=fake_sources)
    train, val = prepare_data(cfg, log=lambda *a: None)
    assert (tmp_path / "run/data/tokenizer/tokenizer.json").read_text() == (tok_src / "tokenizer.json").read_text()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_src / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    docs = corpus.keyed_documents(fake_sources, render_chat)
    held = [t for key, _, t in docs if corpus.held_out(key, 0.25)]
    assert held and len(held) < len(docs)
    expect = [i for t in held for i in tok.encode(t).ids + [eot]]
    assert val.tolist() == expect  # the val stream is exactly the held-out sources, in corpus order
    assert len(train) + len(val) == sum(len(tok.encode(t).ids) + 1 for _, _, t in docs)
    # a held-out file's code chats and excerpts are held out with it
    for key, kind, text in docs:
        if kind in ("code-chat", "long-code-chat") and corpus.held_out(key, 0.25):
            assert text in held
    assert len(train) > 2049 and batch_at(train, 0, 3, 2, 2048).shape == (2, 2049)  # 2,048-token windows
    with pytest.raises(ValueError, match="split"):
        prepare_data(TargetTrainConfig(out=tmp_path / "bad", split="random", corpus=fake_sources))


def test_validation_is_fixed_windows(tmp_path):
    from mlx_lm.models import qwen3

    cfg = TargetTrainConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=64)
    mx.random.seed(0)
    model = qwen3.Model(cfg.model_args(50))
    val = np.random.default_rng(0).integers(0, 50, 3000).astype(np.uint16)
    a, b = validation(model, val, 256, batches=2, batch_size=2), validation(model, val, 256, batches=2, batch_size=2)
    assert a == b and np.log(50) - 1 < a[0] < np.log(50) + 2 and 0 <= a[1] <= 1
    assert validation(model, val[:100], 2048, batches=1, batch_size=1)  # windows shrink to a short stream


def test_raw_prompts_and_eval_sets(fake_sources, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "def f(x):\\n", "kind": "raw-code"}\n{"text": 3}\n')
    with pytest.raises(mlx_spec.MlxSpecError, match="must be a string"):
        read_prompts(f)
    f.write_text('{"text": "def f(x):\\n", "kind": "raw-code"}\n')
    (p,) = read_prompts(f)
    model, tok = mlx_spec.load(drafter=None)
    assert encode(tok, p) == tok.encode("def f(x):\n")  # no chat template around a raw prompt
    raw_eval = mix.raw_code_prompts(fake_sources, 10, held=True, fraction=0.25)
    raw_train = mix.raw_code_prompts(fake_sources, 10, held=False, fraction=0.25)
    # each ends on its `def` line's last character (a bare trailing newline reads as a block's end)
    assert raw_eval and raw_train and all(r["text"].split("\n")[-1].startswith("def ") for r in raw_eval)
    assert not {r["text"] for r in raw_eval} & {r["text"] for r in raw_train}
    old = mix.raw_code_prompts(fake_sources, 10, held=True, fraction=0.25, newline=True)  # the pre-session-22 sets
    assert [r["text"] for r in old] == [r["text"] + "\n" for r in raw_eval]
    long_eval = mix.long_prompts(fake_sources, 6, held=True, fraction=0.25)
    assert long_eval and all(p["messages"][-1]["role"] == "user" for p in long_eval)
    held_files = [p for p in corpus.stdlib_files(fake_sources.stdlib)
                  if corpus.held_out(corpus._key(fake_sources.stdlib, p), 0.25)]
    for p in long_eval:
        if p["messages"][0]["content"].startswith("```python"):
            excerpt = p["messages"][0]["content"].split("```python\n")[1].split("\n```")[0]
            assert any(excerpt in f.read_text() for f in held_files)
    bounded = mix.within(long_eval, tok, 300, 2000)
    assert all(300 <= len(encode(tok, p)) <= 2000 for p in bounded)
    prompts = mix.drafter_mix(fake_sources, 5, 5, 5, 4, fraction=0.25)
    assert {p["kind"] for p in prompts} == {"code", "chat", "raw-code", "long"}


def test_a_mix_after_another_keeps_its_rows_first_and_adds_what_it_lacks(tmp_path):
    pool = [{"kind": k, "text": f"{k} {'x' * (5 - i)}{i}"} for i in range(5) for k in ("code", "chat")]
    done = [pool[0], pool[1], pool[0]]  # duplicates in the first mix: every copy counts as answered
    src, first, out = tmp_path / "pool.jsonl", tmp_path / "first.jsonl", tmp_path / "out.jsonl"
    mix.write(src, pool)
    mix.write(first, done)
    subprocess.run([sys.executable, "-m", "mlx_spec.train.mix", str(out), "--from", str(src), "--after", str(first),
                    "--code", "2", "--chat", "1", "--raw", "0", "--long", "0"], check=True, capture_output=True)
    got = mix.read(out)
    assert got[:3] == done  # their ids, and so their generated answers, are kept
    assert sorted(r["text"] for r in got[3:]) == ["chat xxxx1", "code xxx2", "code xxxx1"]
    assert [len(r["text"]) for r in got[3:]] == sorted(len(r["text"]) for r in got[3:])  # shortest first


def test_a_subset_takes_the_first_of_each_kind_shuffled(tmp_path):
    rows = [{"kind": k, "text": f"{k} {i}"} for i in range(5) for k in ("code", "chat", "raw-code", "long")]
    src, out = tmp_path / "mix.jsonl", tmp_path / "sub.jsonl"
    mix.write(src, rows)
    cli = [sys.executable, "-m", "mlx_spec.train.mix", str(out), "--from", str(src), "--code", "2", "--chat", "1",
           "--raw", "3", "--long", "0"]
    subprocess.run(cli, check=True, capture_output=True)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    want = ["code 0", "code 1", "chat 0", "raw-code 0", "raw-code 1", "raw-code 2"]
    assert sorted(r["text"] for r in got) == sorted(want)
    assert got == mix.subset(rows, {"code": 2, "chat": 1, "raw-code": 3, "long": 0}, seed=0)
    assert [r["text"] for r in got] != want  # shuffled, not in kind order
    # --by-length: the same subset, shortest (encoded) first, ties in the shuffled order
    rows = [{"kind": "raw-code", "text": "x " * (9 - i)} for i in range(4)] + [{"kind": "code", "text": "y"}]
    mix.write(src, rows)
    subprocess.run(cli[:6] + ["--code", "1", "--raw", "4", "--chat", "0", "--long", "0", "--by-length"],
                   check=True, capture_output=True)
    got = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert got == ["y"] + ["x " * n for n in (6, 7, 8, 9)]


def test_eval_drafter_measures_raw_prompts():
    model, tok = mlx_spec.load()
    got = measure(model, tok, [{"kind": "raw-code", "text": "def add(a, b):\n"}], max_tokens=16, block_size=4)
    assert got["raw-code"].rounds > 0 and got["raw-code"].tau >= 1.0


def test_distinct_ngrams():
    assert distinct_ngrams([1, 2, 3, 4, 5]) == 1.0
    assert distinct_ngrams([7] * 10) == pytest.approx(1 / 7)
    assert distinct_ngrams([1, 2, 3]) is None


def test_eval_target_cli(tmp_path, capsys, target_dir):
    from mlx_spec.cli import main

    assert main(["eval-target", "--val", str(tmp_path / "missing.npy")]) == 2
    assert main(["eval-target", "--val", str(tmp_path / "missing.npy"), "--seq-lens", "x"]) == 2
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    val = tmp_path / "val.npy"
    np.save(val, np.random.default_rng(0).integers(0, vocab, 600).astype(np.uint16))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "kind": "code"}\n{"prompt": "hello", "kind": "chat"}\n')
    assert main(["eval-target", "--model", str(target_dir), "--val", str(val), "--seq-lens", "64,128",
                 "--batches", "1", "--prompts", str(prompts), "--max-tokens", "24"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["val_loss_64"] > 0 and 0 <= out["val_acc_128"] <= 1 and out["val_tokens"] == 600
    assert set(out["repetition"]) == {"code", "chat", "all"}
    assert 0 < out["repetition"]["all"]["distinct4"] <= 1


def tiny_run(out: Path, corpus, **settings) -> TargetTrainConfig:
    """A target run small enough to train in a test: one layer, 64-token windows, two steps, the embedded
    tokenizer, a 25% held-out split by source."""
    defaults = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                    seq_len=64, batch_size=1, steps=2, warmup=1, eval_every=100, eval_batches=1,
                    checkpoint_every=100, split="source", val_fraction=0.25,
                    tokenizer_from=Path(mlx_spec.__file__).parent / "models" / "default" / "target")
    return TargetTrainConfig(out=out, corpus=corpus, **{**defaults, **settings})


def test_target_training_resumes_exactly(fake_sources, tmp_path):
    """A run stopped with `until` and resumed ends with the same weights as a straight run (the batch at
    step s depends only on seed and s; the optimizer state is checkpointed)."""
    from mlx_spec.errors import MlxSpecError
    from mlx_spec.train.checkpoint import stopped
    from mlx_spec.train.target import train

    def cfg(out):
        return tiny_run(out, fake_sources, seq_len=96, steps=4, eval_every=2)

    straight = train(cfg(tmp_path / "a"))
    assert train(cfg(tmp_path / "b"), until=2) is None
    assert json.loads((tmp_path / "b/checkpoint/state.json").read_text())["step"] == 2
    resumed = train(cfg(tmp_path / "b"))
    a, b = mx.load(str(straight / "model.safetensors")), mx.load(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)
    log = [json.loads(line) for line in (tmp_path / "b/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and "val_loss" in log[1]
    assert json.loads((resumed / "config.json").read_text())["mlx_spec"]["seq_len"] == 96
    assert train(cfg(tmp_path / "c"), until=0) is None and not (tmp_path / "c/checkpoint").exists()  # data only
    assert "before the first step" in stopped(tmp_path / "c/checkpoint")
    assert train(cfg(tmp_path / "d"), until=1) is None
    with pytest.raises(MlxSpecError, match="another run.*batch_size"):  # the run's batches would change
        train(dataclasses.replace(cfg(tmp_path / "d"), batch_size=2))


def test_init_from_takes_a_model_or_a_checkpoint(fake_sources, tmp_path, capsys):
    """`--init-from` continues from a run's checkpoint as from an exported model (the shipped target's
    heal stage starts from the unlikelihood run's step-10 checkpoint); anything else is refused before
    the corpus is built."""
    from mlx_spec.cli import main
    from mlx_spec.train.target import train

    assert train(tiny_run(tmp_path / "a", fake_sources), until=1) is None
    started = train(tiny_run(tmp_path / "b", fake_sources, lr=0.0, seed=1),  # lr 0: the weights stay as loaded
                    init_from=tmp_path / "a/checkpoint")
    a, b = mx.load(str(tmp_path / "a/checkpoint/weights.safetensors")), mx.load(str(started / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)
    again = train(tiny_run(tmp_path / "c", fake_sources, lr=0.0, seed=1), init_from=started)
    assert all(mx.array_equal(a[k], mx.load(str(again / "model.safetensors"))[k]).item() for k in a)

    assert main(["train-target", "--out", str(tmp_path / "d"), "--init-from", str(tmp_path / "nope")]) == 2
    assert "neither an exported model" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_chat_questions_are_single_substantive_messages(monkeypatch):
    """Openers and the users' questions, 20-150 characters, each once, never an excluded (evaluation) text."""
    talks = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How are you doing today?"},
              {"role": "user", "content": "Good. What kind of music do you like?"}],
             [{"role": "user", "content": "I just adopted a puppy, she is tiny!"},
              {"role": "assistant", "content": "Nice"}, {"role": "user", "content": "Do you like dogs more than cats?"}],
             [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"},
              {"role": "user", "content": "Good. What kind of music do you like?"},
              {"role": "user", "content": "Why? " + "x" * 200 + "?"}]]
    monkeypatch.setattr(corpus, "chitchat_chats", lambda: iter(talks))
    got = corpus.chat_questions(10, exclude={"Do you like dogs more than cats?"})
    texts = sorted(p["messages"][0]["content"] for p in got)
    assert texts == ["Good. What kind of music do you like?", "I just adopted a puppy, she is tiny!"]
    assert all(p["kind"] == "chat" and len(p["messages"]) == 1 and p["messages"][0]["role"] == "user" for p in got)
    assert corpus.chat_questions(10, exclude=set()) != [] and len(corpus.chat_questions(1)) == 1
