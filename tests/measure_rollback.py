"""Not a test: `python tests/measure_rollback.py [DIR]`. Rollback cost on a Qwen3.5-shaped random model (3 Gated DeltaNet : 1 attention) vs a dense qwen3 of the same size."""
import sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
import factory, archs, mlx_lm, mlx_spec
from mlx_spec.engine import cache as cache_mod

d = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()); tok = d / "tok"
if not (tok / "tokenizer.json").exists(): factory.make_tokenizer(tok)
W = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
hy = archs.make(d / "q35", tok, "qwen3_5", layers=8, text_config={**archs.FAMILIES["qwen3_5"]["text_config"], **W,
     "linear_num_value_heads": 8, "linear_num_key_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
     "full_attention_interval": 4}, **W)
archs.FAMILIES["qwen3"] = dict(model_type="qwen3")
dense = archs.make(d / "qwen3", tok, "qwen3", layers=8, **W)

replays = {"tokens": 0, "time": 0.0}  # tokens replayed after partial acceptance, and the time it took (synced)
orig_add = cache_mod.PromptCache.add
def add(self, tokens, hidden):
    behind = cache_mod.pending(self.cache)
    if behind:
        t = time.perf_counter(); orig_add(self, tokens, hidden); cache_mod.eval_state(self)
        replays["tokens"] += behind; replays["time"] += time.perf_counter() - t
        return
    orig_add(self, tokens, hidden)
cache_mod.PromptCache.add = add

prompt = "def add(a, b):\n    return a + b\n"
for name, path in (("qwen3.5-shaped", hy), ("dense qwen3", dense)):
    model, tk = mlx_spec.load(str(path), drafter=None)
    ref = [r.token for r in mlx_lm.stream_generate(*mlx_lm.load(str(path)), prompt, max_tokens=64)]
    ids = tk.encode(prompt)
    for er in (None, 1.0, 0.15, 0.0):
        model.drafter = None if er is None else factory.OracleDrafter(ids + ref, 8, er, seed=1, vocab=300)
        best = None
        for rep in range(3):
            replays.update(tokens=0, time=0.0)
            t = time.perf_counter(); out = []
            for r in mlx_spec.stream_generate(model, tk, prompt, max_tokens=64, block_size=None if er is None else 8):
                out += r.tokens
            dt = time.perf_counter() - t
            if best is None or dt < best[0]: best = (dt, r.spec, dict(replays), len(out))
        dt, st, rp, n = best
        acc = "plain" if er is None else f"accept {st.accepted}/{st.drafted}"
        print(f"{name:15s} {acc:18s} {n/dt:7.1f} tok/s  rounds {st.rounds:3d}  replayed {rp['tokens']:3d} tokens in {rp['time']*1e3:6.1f} ms"
              f" ({rp['time']/max(1,st.rounds)*1e3:.2f} ms/round)", flush=True)
