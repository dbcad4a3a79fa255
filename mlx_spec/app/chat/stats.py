"""The numbers after each reply, /stats, and the speedup estimate against plain decoding."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_spec import GenerationResponse, SpecStats

def estimate_speedup(tps: float, baseline_tps: float | None) -> float | None:
    """Speedup over plain decoding: this reply's tokens/s over measured plain decoding tokens/s."""
    if not baseline_tps or tps <= 0:
        return None
    return tps / baseline_tps


@dataclass
class Turn:
    """One reply's numbers, updated every round so that a stopped reply has them too."""

    speculative: bool
    spec: SpecStats = field(default_factory=SpecStats)
    tokens: int = 0
    tps: float = 0.0
    ttft: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish: str | None = None  # "stop", "length", or None when the user stopped it
    rounds_seen: int = 0

    def add(self, r: GenerationResponse) -> None:
        if self.rounds_seen and self.speculative:  # the first response is the prefill's token, not a verify round
            self.spec.add(r)
        self.rounds_seen += 1
        self.tokens, self.tps, self.ttft = r.generation_tokens, r.generation_tps, r.time_to_first_token
        self.prompt_tokens, self.cached_tokens, self.finish = r.prompt_tokens, r.cached_tokens, r.finish_reason


def stats_line(t: Turn, baseline_tps: float | None) -> str:
    parts = [f"{t.tokens} tok", f"{t.tps:.1f} tok/s", f"TTFT {_duration(t.ttft)}",
             f"prompt {t.prompt_tokens} ({t.cached_tokens} cached)"]
    if t.speculative:
        parts.append(f"τ {t.spec.tau:.2f}" if t.spec.drafting_rounds else "τ –")  # – : no round drafted
        speedup = estimate_speedup(t.tps, baseline_tps) if t.tokens >= 8 else None
        parts.append(f"{speedup:.2f}× plain (est.)" if speedup else "speedup n/a")
    else:
        parts.append("plain decoding")
    parts += {None: ["stopped"], "length": ["max_tokens"]}.get(t.finish, [])
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def report(last: Turn | None, total: SpecStats, baseline_tps: float | None, curve=None, width: int = 24) -> list[str]:
    """/stats: counters for the last reply and the session, then acceptance by draft position."""
    lines = []
    for name, s in (("last reply", last.spec if last else None), ("session", total)):
        if s is None or not s.drafted:
            lines.append(f"{name:<11} no drafts yet")
        else:
            lines.append(f"{name:<11} τ {s.tau:.2f} · {s.accepted}/{s.drafted} drafts accepted in {s.drafting_rounds} "
                         f"drafting rounds · {s.tokens_per_pass:.2f} tokens per target pass ({s.rounds} passes)")
    if total.drafted_per_position:
        lines.append("acceptance by draft position (session):")
        for i, (rate, n) in enumerate(zip(total.acceptance_rates, total.drafted_per_position)):
            bar = "█" * round(rate * width)
            lines.append(f"  {i + 1:>3}  {bar:<{width}} {rate:6.1%}  of {n}")
    base = f"{baseline_tps:.1f} tok/s (measured)" if baseline_tps else "not measured yet"
    lines.append(f"plain decoding: {base}")
    if curve is not None:  # what the draft-length controller works from
        lines.append("verify cost t(M)/t(1), M = 1…: " + " ".join(f"{r:.2f}" for r in curve.ratios()))
        lines.append("round cost / plain step, k = 0… drafts: " + " ".join(f"{r:.2f}" for r in curve.round_ratios()))
    return lines
