"""Long multi-turn chats in the target's own words (issue #19's long chat): the drafter's ninth-stage training
chats (`train.mix --long-talks`) and the held-out evaluation set (`train.mix --eval`'s long-chat.jsonl)."""

import json
import random
import subprocess
import sys

import pytest

import mlx_spec
from mlx_spec.train import mix
from mlx_spec.train.data import builtin_prompts, encode, read_prompts


@pytest.fixture(scope="module")
def tok():
    return mlx_spec.load(drafter=None)[1]


def pairs(n: int, words: int = 60) -> list[tuple[list[dict], str]]:
    rng = random.Random(n)
    vocab = "def return value list the of a to for in if self name".split()
    return [([{"role": "user", "content": f"Write function number {i}."}], " ".join(rng.choices(vocab, k=words)))
            for i in range(n)]


def test_long_talks_chain_answered_requests_to_the_asked_length(tok):
    qa = pairs(60)
    answer_of = {q[0]["content"]: a for q, a in qa}
    chats = mix.long_talks(qa, tok, 6, lo=600, hi=900, seed=1)
    assert len(chats) == 6 and all(c["kind"] == "long" for c in chats)
    for chat in chats:
        assert 600 <= len(encode(tok, chat)) <= 900
        *turns, ask = chat["messages"]
        assert ask["role"] == "user" and ask["content"] in answer_of and len(turns) >= 2
        for user, assistant in zip(turns[::2], turns[1::2]):  # each earlier request, then the target's answer to it
            assert (user["role"], assistant["role"]) == ("user", "assistant")
            assert assistant["content"] == answer_of[user["content"]]
    assert mix.long_talks(qa, tok, 6, lo=600, hi=900, seed=1) == chats  # a recipe: the same chats again
    assert mix.long_talks(qa, tok, 6, lo=600, hi=900, seed=2) != chats
    with pytest.raises(ValueError, match="too few or short"):
        mix.long_talks(pairs(3, words=5), tok, 2, lo=600, hi=900)
    assert mix.long_talks(qa, tok, 0) == []


def test_answered_pairs_each_code_request_with_the_answer_after_its_prompt(tok):
    prompts = [{"kind": "code", "messages": [{"role": "user", "content": "a"}]}, {"kind": "raw-code", "text": "def f("},
               {"kind": "code", "messages": [{"role": "user", "content": "b"}]}]
    answer_b, answer_a = tok.encode("return 2", add_special_tokens=False), tok.encode("x = 1", add_special_tokens=False)
    eos = tok.eos_token_id
    records = [{"id": 2, "kind": "code", "tokens": encode(tok, prompts[2]) + answer_b + [eos],  # data.jsonl: any order
                "prompt_len": len(encode(tok, prompts[2]))},
               {"id": 1, "kind": "raw-code", "tokens": encode(tok, prompts[1]) + [5], "prompt_len": len(encode(tok, prompts[1]))},
               {"id": 0, "kind": "code", "tokens": encode(tok, prompts[0]) + answer_a, "prompt_len": len(encode(tok, prompts[0]))}]
    # the answer's EOS (train-drafter keeps it) is dropped: the chat template closes the turn itself
    assert mix.answered(prompts, records, tok) == [(prompts[0]["messages"], "x = 1"), (prompts[2]["messages"], "return 2")]
    for wrong in ({**records[0], "id": 0}, {**records[0], "id": 3}, {**records[0], "id": -1}):
        with pytest.raises(ValueError, match="--answers must be the data.jsonl"):  # another mix's answers
            mix.answered(prompts, [wrong], tok)


def test_the_cli_appends_long_talks_after_the_mix_whose_answers_it_reads(tok, tmp_path):
    done = [{"kind": "code", "messages": q} for q, _ in pairs(40)]
    records = [{"id": i, "kind": "code", "tokens": encode(tok, p) + tok.encode(a, add_special_tokens=False),
                "prompt_len": len(encode(tok, p))} for i, (p, (_, a)) in enumerate(zip(done, pairs(40)))]
    first, answers, out = tmp_path / "mix.jsonl", tmp_path / "data.jsonl", tmp_path / "out.jsonl"
    mix.write(first, done)
    answers.write_text("".join(json.dumps(r) + "\n" for r in records))
    cli = [sys.executable, "-m", "mlx_spec.train.mix", str(out), "--long-talks", "3"]
    run = subprocess.run(cli + ["--after", str(first)], capture_output=True, text=True)
    assert run.returncode == 2 and "--long-talks needs --after (a mix) and --answers" in run.stderr
    subprocess.run(cli + ["--after", str(first), "--answers", str(answers)], check=True, capture_output=True)
    got = mix.read(out)
    assert got[:40] == done and len(got) == 43  # the mix's ids, and so its answers, are kept
    talks = got[40:]
    assert all(len(t["messages"]) > 2 and 1000 <= len(encode(tok, t)) <= 1900 for t in talks)
    assert [len(json.dumps(t)) for t in talks] == sorted(len(json.dumps(t)) for t in talks)  # shortest first


def test_eval_talks_chain_the_targets_answers_to_the_built_in_prompts(monkeypatch, tok):
    """Held out from every drafter's training: the built-in prompts (never trained on), answered by the target."""
    seen = []

    def answers(model, tokenizer, encoded, max_tokens, temperature=0.0, keep_eos=True):
        seen.append((len(encoded), max_tokens, keep_eos))
        return [tokenizer.encode(f"answer {sum(p)} " + " ".join(["word"] * 90), add_special_tokens=False) for p in encoded]

    monkeypatch.setattr("mlx_spec.train.data.answer_batch", answers)
    chats = mix.eval_talks(None, tok, n=4)
    assert len(chats) == 4 and all(c["kind"] == "long-talk" and 1000 <= len(encode(tok, c)) <= 2000 for c in chats)
    assert sum(n for n, _, _ in seen) == 100 and {(m, k) for _, m, k in seen} == {(128, False)}
    builtin = {p["messages"][0]["content"] for p in read_prompts(builtin_prompts())}
    for chat in chats:
        turns = chat["messages"]
        assert all(m["content"] in builtin for m in turns if m["role"] == "user")
        for user, assistant in zip(turns[::2], turns[1::2]):  # each answer is the one given to its own request
            mark = sum(encode(tok, {"messages": [user]}))
            assert assistant["content"].startswith(f"answer {mark} ")
