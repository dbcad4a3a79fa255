"""Prometheus text metrics. Speculative counters use vLLM's names under the `mlx_spec:` prefix.

Mean acceptance length = 1 + num_accepted_tokens / num_drafts (as in vLLM's dashboards).
"""

from __future__ import annotations

import threading
import time

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
COUNTERS = {
    "prompt_tokens": "Prompt tokens of finished requests, cached ones included.",
    "prompt_tokens_cached": "Prompt tokens served from a reused conversation cache.",
    "generation_tokens": "Generated tokens of finished requests.",
    "spec_decode_num_drafts": "Verify rounds that checked at least one draft token.",
    "spec_decode_num_draft_tokens": "Draft tokens proposed.",
    "spec_decode_num_accepted_tokens": "Draft tokens accepted.",
}


class Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        return out + [f"{name}_sum{{{labels}}} {self.sum:.6f}", f"{name}_count{{{labels}}} {self.count}"]


class Metrics:
    """Updated by the worker thread when a request retires; read by GET /metrics."""

    def __init__(self):
        self.model = ""
        self._lock = threading.Lock()
        self.running = self.waiting = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.accepted_per_pos: list[int] = []
        self.finished: dict[str, int] = {}
        self.latency, self.ttft = Histogram(LATENCY_BUCKETS), Histogram(LATENCY_BUCKETS)
        self.tps = Histogram(TPS_BUCKETS)

    def set_load(self, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting

    def record(self, seq) -> None:
        now, s = time.monotonic(), seq.stats
        with self._lock:
            c = self.counters
            c["prompt_tokens"] += len(seq.job.ids)
            c["prompt_tokens_cached"] += seq.cached_tokens
            c["generation_tokens"] += seq.completion_tokens
            c["spec_decode_num_drafts"] += s.drafting_rounds
            c["spec_decode_num_draft_tokens"] += s.drafted
            c["spec_decode_num_accepted_tokens"] += s.accepted
            grow = len(s.accepted_per_position) - len(self.accepted_per_pos)
            self.accepted_per_pos += [0] * max(0, grow)
            for i, a in enumerate(s.accepted_per_position):
                self.accepted_per_pos[i] += a
            self.finished[seq.finish_reason] = self.finished.get(seq.finish_reason, 0) + 1
            self.latency.observe(now - seq.submitted)
            if seq.first_token is not None:
                self.ttft.observe(seq.first_token - seq.submitted)
                if seq.completion_tokens > 1 and now > seq.first_token:
                    self.tps.observe((seq.completion_tokens - 1) / (now - seq.first_token))

    def render(self) -> str:
        m = 'model_name="{}"'.format(self.model.replace("\\", "\\\\").replace('"', '\\"'))
        out: list[str] = []

        def family(name, kind, help_text, samples):
            out.extend([f"# HELP mlx_spec:{name} {help_text}", f"# TYPE mlx_spec:{name} {kind}"])
            out.extend(samples)

        with self._lock:
            family("num_requests_running", "gauge", "Requests in the verify loop.",
                   [f"mlx_spec:num_requests_running{{{m}}} {self.running}"])
            family("num_requests_waiting", "gauge", "Requests waiting for a slot.",
                   [f"mlx_spec:num_requests_waiting{{{m}}} {self.waiting}"])
            for key, value in self.counters.items():
                family(key, "counter", COUNTERS[key], [f"mlx_spec:{key}_total{{{m}}} {value}"])
            family("spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted draft tokens by draft position.",
                   [f'mlx_spec:spec_decode_num_accepted_tokens_per_pos_total{{{m},position="{i}"}} {a}'
                    for i, a in enumerate(self.accepted_per_pos)])
            family("request_success", "counter", "Finished requests by finish reason.",
                   [f'mlx_spec:request_success_total{{{m},finished_reason="{k}"}} {v}'
                    for k, v in sorted(self.finished.items())])
            family("e2e_request_latency_seconds", "histogram", "Request latency from arrival to finish.",
                   self.latency.lines("mlx_spec:e2e_request_latency_seconds", m))
            family("time_to_first_token_seconds", "histogram", "Time from arrival to the first token.",
                   self.ttft.lines("mlx_spec:time_to_first_token_seconds", m))
            family("request_generation_tokens_per_second", "histogram", "Decode speed of each request.",
                   self.tps.lines("mlx_spec:request_generation_tokens_per_second", m))
        return "\n".join(out) + "\n"
