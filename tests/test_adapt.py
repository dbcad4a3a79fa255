"""`mlx-spec adapt` on the tiny pair: it resumes, never installs a worse drafter, rolls back exactly,
and an adapted drafter (even a ruined one) leaves greedy output unchanged."""

import hashlib
import shutil

import pytest
from mlx.utils import tree_flatten

import factory
import mlx_spec
from mlx_spec import adapters
from mlx_spec.history import History, target_key
from mlx_spec.loading import Loaded, find_drafter
from mlx_spec.train.adapt import AdaptConfig, Adaptation, verdict

PROMPTS = ["def add(a, b):", "class Stack:", "for i in range(10):", "import os", "Hello, how are", "The quick brown",
           "print(os.path.join", "def push(self, x):", "I am fine,", "return a +", "self.items.append(", "jumps over"]


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # never the real home
    return tmp_path / "data"


@pytest.fixture(scope="module")
def pair(models_dir, target_dir):
    drafter = factory.make_drafter(models_dir / "adapt-dflash", target_dir, block_size=4)
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter))
    return model, tok, drafter


def record(model, tok, key: str) -> History:
    store = History.for_target(key)
    for p in PROMPTS:
        ids, out, last = tok.encode(p), [], None
        for last in mlx_spec.stream_generate(model, tok, ids, 12, logit_bias={0: -100, 2: -100}):
            out += last.tokens
        store.record_generation(ids, out, last.spec)
    return store


def small(**kw) -> AdaptConfig:
    return AdaptConfig(**{"steps": 6, "warmup": 2, "checkpoint_every": 2, "eval_tokens": 8, "general_prompts": 3,
                          "sequences_per_step": 2, "anchors_per_sequence": 4, "rehearsal_tokens": 6, **kw})


def weights(drafter) -> dict:
    return {k: v.tolist() for k, v in tree_flatten(drafter.parameters())}


def test_adaptation_resumes_where_it_stopped(pair, target_dir):
    model, tok, drafter = pair
    key = target_key(str(target_dir))
    record(model, tok, key)
    job = Adaptation(model, tok, key, small(), drafter)
    units = job.run()
    trained = 0
    for unit in units:
        trained += unit.phase == "train"
        if trained == 3:  # stopped (a kill) after step 3; the checkpoint is from step 2
            break
    units.close()
    assert (adapters.work_dir(key) / "checkpoint").exists() and (adapters.work_dir(key) / "before.json").exists()
    assert (adapters.folder(key) / "rehearsal.jsonl").exists()  # the target's answers to the rehearsed prompts
    resumed = Adaptation(model, tok, key, small(), drafter)
    phases = [u.phase for u in resumed.run()]
    assert "before" not in phases  # the first run's measurement was kept
    assert phases.count("train") == 4  # steps 3..6
    assert resumed.result["steps"] == 6
    # The resumed run is the uninterrupted run: batch s depends only on seed and s.
    shutil.rmtree(adapters.folder(key))
    straight = Adaptation(model, tok, key, small(), drafter)
    for _ in straight.run():
        pass
    assert weights(straight.candidate) == weights(resumed.candidate)


def test_a_worse_drafter_is_never_installed(pair, target_dir):
    model, tok, drafter = pair
    key = target_key(str(target_dir))
    record(model, tok, key)
    job = Adaptation(model, tok, key, small(lr=50.0, warmup=1), drafter)  # destructive
    for _ in job.run():
        pass
    r = job.result
    assert not r["accepted"] and "installed" not in r
    assert r["after"]["held_out"]["tau"] <= r["before"]["held_out"]["tau"]
    assert adapters.current(key) is None and adapters.manifest(key)["versions"] == []
    assert find_drafter(str(target_dir), target_dir) is None  # auto still finds what it found before
    # Lossless whatever the drafter: greedy output with the ruined candidate equals plain decoding.
    ruined = Loaded(model.target, job.candidate, model.target_path, None, model.config)
    for p in PROMPTS[:4]:
        assert mlx_spec.generate(ruined, tok, p, 16) == mlx_spec.generate(model, tok, p, 16, speculative=False)


def test_the_gate():
    def taus(held, general):
        return {"held_out": {"tau": held}, "general": {"tau": general}}

    assert verdict(taus(2.0, 4.0), taus(2.5, 3.85), 0.05) is None  # general fell 3.75%: allowed
    assert "general" in verdict(taus(2.0, 4.0), taus(2.5, 3.7), 0.05)
    assert "held-out" in verdict(taus(2.0, 4.0), taus(2.0, 4.5), 0.05)


def digest(folder) -> dict:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_versions_auto_mode_and_exact_rollback(pair, target_dir, models_dir, tmp_path):
    model, tok, drafter = pair
    key = target_key(str(target_dir))
    first = factory.make_drafter(tmp_path / "a", target_dir, block_size=4, seed=7)
    second = factory.make_drafter(tmp_path / "b", target_dir, block_size=4, seed=8)
    first_digest = digest(first)
    report = {"before": {}, "after": {}}
    v1 = adapters.install(key, shutil.copytree(first, tmp_path / "a-copy"), report)
    loaded, _ = mlx_spec.load(str(target_dir))  # --drafter auto, --mode auto
    assert loaded.drafter_path == v1
    v2 = adapters.install(key, shutil.copytree(second, tmp_path / "b-copy"), report)
    assert mlx_spec.load(str(target_dir))[0].drafter_path == v2
    text = mlx_spec.generate(mlx_spec.load(str(target_dir))[0], tok, "def add(a, b):", 16)
    assert text == mlx_spec.generate(model, tok, "def add(a, b):", 16, speculative=False)
    assert adapters.rollback(key) == 1
    assert find_drafter(str(target_dir), target_dir) == v1 and digest(v1) == first_digest  # byte-identical
    assert adapters.rollback(key) == 0
    assert find_drafter(str(target_dir), target_dir) is None
    with pytest.raises(mlx_spec.MlxSpecError, match="nothing to roll back"):
        adapters.rollback(key)


def test_adapt_command_rollback_and_list(target_dir, capsys, tmp_path):
    from mlx_spec.cli import main

    key = target_key(str(target_dir))
    d = factory.make_drafter(tmp_path / "d", target_dir, block_size=4)
    taus = {"held_out": {"tau": 2.0}, "general": {"tau": 3.0}}
    adapters.install(key, d, {"before": taus, "after": taus})
    assert main(["adapt", "--model", str(target_dir), "--list"]) == 0
    assert "v1" in capsys.readouterr().out
    assert main(["adapt", "--model", str(target_dir), "--rollback"]) == 0
    assert "shipped" in capsys.readouterr().out and adapters.current(key) is None


def test_serve_adapts_when_idle_and_requests_still_come_first(pair, target_dir):
    import time

    from test_server_harness import EOS_BIAS, RunningServer

    from mlx_spec.app.server.config import LearnConfig, ModelConfig, ServerConfig

    model, tok, drafter = pair
    plain = mlx_spec.generate(model, tok, tok.encode("def add(a, b):", add_special_tokens=False), 10,
                              speculative=False, logit_bias={0: -100, 2: -100})
    learn = LearnConfig(record=True, adapt_when_idle=0.2, min_new_records=len(PROMPTS))
    server = RunningServer(ServerConfig(model=ModelConfig(target=str(target_dir), drafter=str(drafter)), learn=learn))
    try:
        idle = server.state.scheduler.idle
        idle.cfg = small(steps=40)
        client = server.client()

        def complete(prompt):
            return client.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0,
                                             logit_bias=EOS_BIAS).choices[0].text

        for p in PROMPTS:
            complete(p)
        deadline = time.monotonic() + 60
        while idle.job is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert idle.job is not None  # started once the server was idle
        t0 = time.monotonic()
        assert complete("def add(a, b):") == plain  # served mid-adaptation, unchanged
        assert time.monotonic() - t0 < 5
        while not idle.results and time.monotonic() < deadline:
            time.sleep(0.05)
        (result,) = idle.results
        assert result["steps"] >= 1 and "held_out" in result["after"]
    finally:
        server.stop()
