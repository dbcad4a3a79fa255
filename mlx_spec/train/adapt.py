"""Fine-tune the current drafter on the user's recorded traffic, and install it only if it is better.

An `Adaptation` is a generator of small units of work (one training step, or one evaluation
prompt), so `mlx-spec adapt` can run it under a progress bar and the server's worker can run
it between requests. Phases:

1. split: the most recent slice of the history is held out; the split is written to the
   work folder (with the data), so a resumed run trains and evaluates on the same records.
2. before: τ of the current drafter on the held-out slice and on the built-in general prompts.
3. train: the train-drafter trainer (`DrafterTrainer`), started from the current drafter's
   weights, checkpointing in the work folder; a step and a time budget bound it. Without
   rehearsal a drafter tuned to one domain forgets the rest (measured: general τ 5.5 → 2.1),
   so part of every batch is the target's own answers to half of the built-in prompts
   (generated once per target, cached); the general τ is measured on the other half.
4. after: τ of the candidate on both sets; installed as a new version only if held-out τ
   improved and general τ fell by no more than `general_tolerance`.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from .. import adapters
from ..errors import MlxSpecError
from ..history import History


@dataclass
class AdaptConfig:
    steps: int = 300
    minutes: float | None = None  # stops training early; evaluation still runs
    lr: float = 3e-4  # fine-tuning: a third of train-drafter's peak
    warmup: int = 20
    sequences_per_step: int = 4
    anchors_per_sequence: int = 16
    holdout: float = 0.1  # the most recent fraction of records, for the held-out τ
    max_holdout: int = 40
    eval_tokens: int = 64
    general_prompts: int | None = None  # built-in prompts for the general τ (None: all 50 of the evaluation half)
    rehearsal_share: float = 0.5  # of training sequences: the target's answers to the other half (0: none)
    rehearsal_tokens: int = 128
    general_tolerance: float = 0.05
    max_sequence: int = 1024  # longer records are cut (their hidden states are recomputed each step)
    checkpoint_every: int = 25
    seed: int = 0


@dataclass
class Unit:
    """What one unit of work did, for a progress bar."""

    phase: str  # before, train, after
    done: int
    total: int
    info: str = ""


class Adaptation:
    def __init__(self, model, tokenizer, key: str, cfg: AdaptConfig, base: Path, history: History | None = None):
        """model: the loaded pair (`mlx_spec.load`) whose drafter is the one at `base`."""
        self.model, self.tokenizer, self.key, self.cfg, self.base = model, tokenizer, key, cfg, Path(base)
        self.history = history or History.for_target(key)
        self.work = adapters.work_dir(key)
        self.result: dict | None = None
        self.n_history = 0  # records in the history when this adaptation took its data
        self.candidate = None  # the trained drafter, once training ends (installed or not)

    def run(self) -> Iterator[Unit]:
        train, held = self._split()
        before = self._load_json("before.json")
        if before is None:
            before = {}
            yield from self._measure(self._pair(self._base_drafter()), train_prompts=held, out=before, phase="before")
            self._save_json("before.json", before)
        rehearsal = []
        if self.cfg.rehearsal_share > 0:
            rehearsal = yield from self._rehearsal()
        trainer = self._trainer(train, rehearsal)
        deadline = time.monotonic() + self.cfg.minutes * 60 if self.cfg.minutes else None
        while not trainer.done and (deadline is None or time.monotonic() < deadline):
            record = trainer.step()
            yield Unit("train", trainer.step_no, self.cfg.steps, trainer.info(record))
        trainer.save_checkpoint()
        self.candidate = trainer.drafter
        after: dict = {}
        yield from self._measure(self._pair(trainer.drafter), train_prompts=held, out=after, phase="after")
        self.result = self._decide(before, after, trainer, len(train), len(held))

    # -- phases ----------------------------------------------------------------------------------

    def _split(self) -> tuple[list[dict], list[dict]]:
        """(training sequences, held-out prompts), fixed at the first run and reread on resume."""
        saved = self._load_json("split.json")
        if saved is not None:
            self.base = Path(saved["base"])  # resume from what this run started from
            self.n_history = saved.get("history_records", 0)
            return saved["train"], saved["held_out"]
        limit = self.cfg.max_sequence
        everything = self.history.records()
        self.n_history = len(everything)
        records = [r for r in everything if len(r.prompt) < limit - 1 and len(r.output) > 1]
        n_held = min(self.cfg.max_holdout, max(1, round(len(records) * self.cfg.holdout)))
        if len(records) < n_held + 1:
            raise MlxSpecError(f"the history has {len(records)} usable records; record more traffic first "
                               "(mlx-spec chat --learn or serve --learn)")
        train = []
        for r in records[:-n_held]:
            seq = r.sequence()
            train.append({"tokens": seq["tokens"][:limit], "prompt_len": seq["prompt_len"]})
        held = [{"messages": r.prompt, "kind": "held_out"} for r in records[-n_held:]]  # token ids are a prompt too
        self.work.mkdir(parents=True, exist_ok=True)
        self._save_json("split.json", {"train": train, "held_out": held, "base": str(self.base),
                                       "history_records": self.n_history})
        return train, held

    def _general(self) -> list[dict]:
        from .data import builtin_prompts, read_prompts

        prompts = read_prompts(builtin_prompts())[0::2]  # the half never rehearsed
        n = self.cfg.general_prompts
        if n and n < len(prompts):  # an even spread over the kinds, in file order
            prompts = [prompts[round(i * len(prompts) / n)] for i in range(n)]
        return [{**p, "kind": "general"} for p in prompts]

    def _measure(self, pair, train_prompts: list[dict], out: dict, phase: str) -> Iterator[Unit]:
        """τ on the held-out and the general prompts, one prompt per unit of work."""
        from .evaluate import measure, merge
        from ..generate import SpecStats

        sets = [("held_out", train_prompts), ("general", self._general())]
        total, done = sum(len(p) for _, p in sets), 0
        for name, prompts in sets:
            stats = SpecStats()
            for p in prompts:
                stats = merge(stats, measure(pair, self.tokenizer, [p], self.cfg.eval_tokens)["all"])
                done += 1
                yield Unit(phase, done, total, f"{name} τ {stats.tau:.2f}")
            out[name] = {"tau": round(stats.tau, 4), "rounds": stats.drafting_rounds,
                         "acceptance": [round(x, 3) for x in stats.acceptance_rates]}

    def _rehearsal(self) -> Iterator[Unit]:
        """The target's greedy answers to the odd half of the built-in prompts, a batch per unit;
        kept in adapters/<target>/rehearsal.jsonl (the same for every adaptation of this target)."""
        from .data import DataConfig, builtin_prompts, generate_data, read_prompts

        prompts = read_prompts(builtin_prompts())[1::2]
        out = adapters.folder(self.key) / "rehearsal.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        batch, records = 4, []
        for n in range(batch, len(prompts) + batch, batch):  # each call answers only what is missing
            records = generate_data(self.model.model, self.tokenizer, prompts[:n], out,
                                    DataConfig(max_tokens=self.cfg.rehearsal_tokens, batch_size=batch))
            yield Unit("rehearse", min(n, len(prompts)), len(prompts), "target answers")
        return records

    def _trainer(self, train: list[dict], rehearsal: list[dict]):
        from .drafter import DrafterTrainConfig, DrafterTrainer

        c = self.cfg
        if rehearsal:  # the trainer samples uniformly: repeat the rehearsal set to its share
            share = min(c.rehearsal_share, 0.9)
            reps = max(1, round(share / (1 - share) * len(train) / len(rehearsal)))
            train = train + [{"tokens": r["tokens"], "prompt_len": r["prompt_len"]} for r in rehearsal] * reps
        base = self._base_drafter()
        tcfg = DrafterTrainConfig(out=self.work, block_size=base.config.block_size, steps=c.steps, lr=c.lr,
                                  warmup=min(c.warmup, max(1, c.steps // 5)), sequences_per_step=c.sequences_per_step,
                                  anchors_per_sequence=c.anchors_per_sequence, checkpoint_every=c.checkpoint_every,
                                  eval_every=1 << 30, seed=c.seed)
        return DrafterTrainer(self.model.target, self.model.config, self.tokenizer, train, tcfg, init=base)

    def _decide(self, before: dict, after: dict, trainer, n_train: int, n_held: int) -> dict:
        from ..drafters.dflash import save_dflash

        reason = verdict(before, after, self.cfg.general_tolerance)
        report = {"base": str(self.base), "steps": trainer.step_no, "history_records": self.n_history,
                  "train_records": n_train, "held_out_records": n_held,
                  "before": before, "after": after, "config": _jsonable(asdict(self.cfg)), "accepted": reason is None,
                  "reason": reason or "held-out τ improved and general τ held"}
        if reason is None:
            candidate = save_dflash(trainer.drafter, self.work / "candidate",
                                    {"mlx_spec": {"trained_with": "mlx-spec adapt", "base": str(self.base)}})
            report["installed"] = str(adapters.install(self.key, candidate, {k: report[k] for k in
                                                                             ("base", "steps", "before", "after")}))
        (adapters.folder(self.key) / "last-report.json").write_text(json.dumps(report, indent=2) + "\n")
        shutil.rmtree(self.work, ignore_errors=True)  # done: the next adaptation starts afresh
        return report

    # -- helpers ---------------------------------------------------------------------------------

    def _base_drafter(self):
        """A private copy of the current drafter (the served one is never trained in place)."""
        from ..drafters import checkpoint_kind
        from ..drafters.dflash import load_dflash

        if checkpoint_kind(self.base) != "dflash":
            raise MlxSpecError(f"{self.base}: local adaptation supports DFlash drafters only")
        return load_dflash(self.base, self.model.target, self.model.config)

    def _pair(self, drafter):
        from ..loading import Loaded

        return Loaded(self.model.target, drafter, self.model.target_path, None, self.model.config,
                      relaid=self.model.relaid)

    def _load_json(self, name: str):
        try:
            return json.loads((self.work / name).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _save_json(self, name: str, value) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.work / (name + ".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(self.work / name)


def verdict(before: dict, after: dict, tolerance: float) -> str | None:
    """Why the candidate must not be installed, or None when it may."""
    hb, ha = before["held_out"]["tau"], after["held_out"]["tau"]
    gb, ga = before["general"]["tau"], after["general"]["tau"]
    if ha <= hb:
        return f"held-out τ did not improve ({hb:.2f} → {ha:.2f})"
    if ga < gb * (1 - tolerance):
        return f"general τ fell more than {tolerance:.0%} ({gb:.2f} → {ga:.2f})"
    return None


def _jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
