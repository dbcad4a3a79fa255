"""The server on a hybrid target (qwen3_5: Gated DeltaNet + attention) with a DFlash drafter tapping both
layer types: concurrent requests share batched verify passes and each gets exactly what it gets alone;
a follow-up reuses the conversation's prefix from the recurrent state's checkpoint."""

import threading

import archs
import factory
from mlx_spec.app.server.config import ModelConfig, ServerConfig
from test_server_harness import EOS_BIAS, RunningServer

PROMPTS = ["def add(a, b):", "Hello, how are you", "for i in range(10):"]


def test_server_on_a_hybrid_target(models_dir, tokenizer_dir):
    target = archs.make(models_dir / "hy-qwen3_5", tokenizer_dir, "qwen3_5", seed=3)
    drafter = factory.make_drafter(models_dir / "hy-qwen3_5-server-dflash", target, taps=(0, 1), block_size=4)
    s = RunningServer(ServerConfig(model=ModelConfig(target=str(target), drafter=str(drafter), block_size=4,
                                                     mode="dflash"), max_active=4))
    try:
        client = s.client()

        def ask(prompt, history=()):
            msgs = list(history) + [{"role": "user", "content": prompt}]
            return client.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0,
                                                  logit_bias=EOS_BIAS)

        alone = [ask(p).choices[0].message.content for p in PROMPTS]
        together = [None] * len(PROMPTS)

        def run(i):
            together[i] = ask(PROMPTS[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [r.choices[0].message.content for r in together] == alone
        assert all(r.model_extra["speculative"]["drafted"] > 0 for r in together)
        history = [{"role": "user", "content": PROMPTS[0]}, {"role": "assistant", "content": alone[0]}]
        follow = ask("and now subtract", history)
        assert follow.usage.prompt_tokens_details.cached_tokens > 0
    finally:
        s.stop()
