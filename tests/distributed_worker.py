"""One rank of a distributed test run: `python tests/distributed_worker.py SPEC.json OUT.json`, started
N times by `distributed_launch` (or `mlx.launch`). Runs the spec's generation cases through a
pipeline-split target; rank 0 writes what they generated, and every rank's share of the weights.

`run_cases` is also what the tests run in one process, for the reference output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten


def run_cases(model, tokenizer, cases: list[dict], tick=lambda: None) -> dict:
    """What each case generates; `tick` after every round (a rank's watchdog: progress was made)."""
    from mlx_spec.generate import make_generation, step_all

    out = {}
    for case in cases:
        if "turns" in case:  # a conversation: each turn continues the last prompt and reply, one cache
            out[case["name"]] = conversation(model, tokenizer, case, tick)
            continue
        gens = [make_generation(model, tokenizer, p, case["max_tokens"], block_size=case.get("block_size"),
                                adaptive=False, speculative=case.get("speculative", True), **case.get("sampling", {}))
                for p in case["prompts"]]
        tokens = [list(g.start().tokens) for g in gens]
        while any(not g.finished for g in gens):
            live = [i for i, g in enumerate(gens) if not g.finished]
            for i, r in zip(live, step_all(model, [gens[i] for i in live])):
                tokens[i] += r.tokens
            tick()
        out[case["name"]] = {"tokens": tokens, "accepted": sum(g.stats.accepted for g in gens),
                             "rounds": sum(g.stats.rounds for g in gens)}
    return out


def conversation(model, tokenizer, case: dict, tick) -> dict:
    from mlx_spec.generate import make_generation, make_prompt_cache, step_all

    pc, ids, turns, accepted = make_prompt_cache(model), [], [], 0
    for text in case["turns"]:
        ids = ids + tokenizer.encode(text)
        g = make_generation(model, tokenizer, ids, case["max_tokens"], block_size=case.get("block_size"),
                            adaptive=False, prompt_cache=pc)
        tokens = list(g.start().tokens)
        while not g.finished:
            tokens += step_all(model, [g])[0].tokens
            tick()
        turns.append(tokens)
        # "edit": the next turn follows the prompt, not the reply (a regenerated or edited message)
        ids, accepted = (ids if case.get("edit") else ids + tokens), accepted + g.stats.accepted
    return {"tokens": turns, "accepted": accepted, "rounds": 0}


def load_kwargs(group: dict) -> dict:
    return dict(drafter=group.get("drafter", "auto"), mode=group.get("mode", "auto"), block_size=group.get("block_size"))


def serve(argv: list[str]) -> None:
    import argparse

    from mlx_spec.app.server.cli import add_arguments, config_from
    from mlx_spec.distributed.serve import run_serve

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--distributed", *argv])
    run_serve(args, config_from(args))  # joins the group this process already formed; never returns


def main(spec_path: str, out_path: str) -> int:
    from mlx_spec.distributed import DistributedError, Session
    from mlx_spec.distributed.load import load_distributed

    spec = json.loads(Path(spec_path).read_text())
    from mlx_spec.distributed.session import DistributedConfig

    session = Session(DistributedConfig(timeout=float(spec.get("timeout", 30))))
    result = {"groups": [], "param_bytes": None}
    try:
        for group in spec["groups"]:
            if "serve" in group:  # `mlx-spec serve --distributed` on these ranks (the last group: it exits)
                serve(group["serve"])
            target = group.get("target_by_rank", {}).get(str(session.rank), group.get("target"))
            with session.guard("loading"):
                model, tokenizer = load_distributed(session, target, **load_kwargs(group))
            nbytes = sum(v.nbytes for _, v in tree_flatten(model.model.parameters()))
            result["param_bytes"] = mx.distributed.all_gather(mx.array([nbytes])[None]).reshape(-1).tolist()
            if group.get("endless"):  # the test kills a rank while this runs
                (Path(group["endless"]) / f"rank{session.rank}.pid").write_text(str(os.getpid()))
            with session.guard("generation"):
                result["groups"].append(run_cases(model, tokenizer, group["cases"], session.progress))
                while group.get("endless"):  # until the test stops a rank (a reply may end early, at EOS)
                    run_cases(model, tokenizer, group["cases"], session.progress)
            if session.is_root:  # after each group: a test may read them while a later group runs
                Path(out_path + ".tmp").write_text(json.dumps(result))
                os.replace(out_path + ".tmp", out_path)
        session.barrier()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
