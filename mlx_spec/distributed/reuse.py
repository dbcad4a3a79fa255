"""A conversation's cache on one rank: prefix reuse that every rank can do alike.

How far back a cache can go exactly depends on its layers (a recurrent state only to before its
latest update, a sliding window a few rows; plain KV anywhere), and ranks hold different layers.
A follow-up prompt must prefill the same tokens on every rank (each prefill pass is a pipeline
pass), so the ranks agree: they keep the common prefix only if every rank can go back to it
exactly, else they all start afresh (dense targets always can; a hybrid then re-prefills).

Some mlx-lm models make one cache per layer of the whole model (falcon_h1 counts
`num_hidden_layers`), not per layer held: a stage keeps its own layers' entries.
"""

from __future__ import annotations

import mlx.core as mx

from ..engine.cache import PromptCache


def prompt_cache_class(group, layout):
    class SharedPromptCache(PromptCache):
        def reset(self) -> None:
            super().reset()
            if len(self.cache) == layout.num_layers != len(self.layers):  # the whole model's: keep this stage's
                self.cache = self.cache[layout.start : layout.end]

        def reuse(self, prompt: list[int]) -> int:
            n = min(self.common_prefix(prompt), len(prompt) - 1)
            able = int(len(self.tokens) - n <= self.max_trim())
            if mx.distributed.all_sum(mx.array(1 - able, mx.int32), group=group).item():  # some rank cannot
                self.reset()
            return super().reuse(prompt)

        @property
        def checkpoint_at(self) -> int | None:
            # Every rank alike (only some hold layers that checkpoint): each prefill pass is a pipeline pass,
            # so each ends where any rank's checkpoint might be, and the last token goes alone.
            return self._mark_at

    return SharedPromptCache
