"""Tiny models built in the tests, in exactly the on-disk formats real users load."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_spec.bench_models import PositionDrafter, random_model, save_model
from mlx_spec.drafters.dflash import DFlashConfig, DFlashDrafter, save_dflash
from mlx_spec.train.tokenizer import MASK, SPECIAL_TOKENS, save_tokenizer, train_tokenizer

TEXT = (
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n"
    "Hello, how are you today? I am fine, thanks for asking. The quick brown fox jumps over the lazy dog.\n"
    "for i in range(10):\n    print(i * i)\nimport os\nprint(os.path.join('a', 'b'))\n"
) * 20

ARCHS = {
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=True, rope_theta=10000.0),
    "llama": dict(model_type="llama", head_dim=16, tie_word_embeddings=False, rope_theta=10000.0),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=10000.0),
    "mistral": dict(model_type="mistral", head_dim=16, tie_word_embeddings=False, rope_theta=10000.0),
    "gemma3_text": dict(model_type="gemma3_text", head_dim=16, rope_theta=10000.0, rope_local_base_freq=10000.0,
                        query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=2),
}


def make_tokenizer(out: Path, vocab_size: int = 320) -> Path:
    save_tokenizer(train_tokenizer([TEXT], vocab_size), out, model_max_length=512)
    return out


def make_tiny_tokenizer(out: Path, letters: str = "abcd") -> Path:
    """A word-level tokenizer of the special tokens plus a few letters (8 ids by default).

    A target this small has next-token laws whose joint over several tokens can be enumerated, and
    random drafters that agree with it often enough to be accepted past the first draft position.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(letters))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one letter, one token
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    save_tokenizer(tok, out, model_max_length=512)
    return out


def make_target(out: Path, tokenizer_dir: Path, arch: str = "qwen3", layers: int = 4, seed: int = 0,
                scale: float = 4.0) -> Path:
    """A random-weight target. Weights are scaled up so that logits are peaked, like a trained model's."""
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = dict(hidden_size=64, num_hidden_layers=layers, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab, max_position_embeddings=512,
                  **ARCHS[arch])
    config["architectures"] = ["RandomForTests"]
    config["eos_token_id"] = 2
    return save_model(random_model(config, seed, scale), config, tokenizer_dir, out)


def tiny_target(models_dir: Path, name: str = "tiny") -> Path:
    """The 8-id target of the sampling tests (llama, 2 layers), built once a session under `name`."""
    tok_dir = models_dir / f"{name}-tokenizer"
    if not tok_dir.exists():
        make_tiny_tokenizer(tok_dir)
    target = models_dir / name
    if not target.exists():
        make_target(target, tok_dir, "llama", layers=2, seed=7, scale=1.6)
    return target


def quantize(src: Path, out: Path, bits: int, group_size: int = 32) -> Path:
    from mlx_lm.utils import load_model, quantize_model

    model, config = load_model(src)
    model, config = quantize_model(model, config, group_size=group_size, bits=bits)
    return save_model(model, config, src, out)


def drafter_config(target_dir: Path, taps, block_size: int, layers: int = 1, cls=DFlashConfig, **extra):
    """The target's config, its mask token id and a small block drafter's config (`cls`: DFlashConfig or a
    subclass, `extra` its own fields) that reads layers `taps` of that target."""
    tcfg = json.loads((target_dir / "config.json").read_text())
    tok = json.loads((target_dir / "tokenizer.json").read_text())
    mask = next(t["id"] for t in tok["added_tokens"] if t["content"] == MASK)
    cfg = cls(hidden_size=tcfg["hidden_size"], num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=128, vocab_size=tcfg["vocab_size"], mask_token_id=mask,
              target_layer_ids=list(taps), block_size=block_size, num_target_layers=tcfg["num_hidden_layers"],
              rope_theta=10000.0, **extra)
    return tcfg, mask, cfg


def make_drafter(out: Path, target_dir: Path, taps=(1, 2), block_size: int = 8, layers: int = 1,
                 seed: int = 1, **overrides) -> Path:
    _, mask, cfg = drafter_config(target_dir, taps, block_size, layers)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    mx.random.seed(seed)
    # Overrides that live in dflash_config (e.g. output_multiplier) must reach the file to take effect.
    nested = {k: v for k, v in overrides.items() if k in ("input_embedding_scale", "output_multiplier")}
    extra = {"dflash_config": {"mask_token_id": mask, "target_layer_ids": list(taps), "block_size": block_size,
                               **nested}} if nested else None
    return save_dflash(DFlashDrafter(cfg), out, extra)


class OracleDrafter(PositionDrafter):
    """A test drafter that knows the right continuation and corrupts some of it.

    It exercises every acceptance path of the loop (none, some, all accepted) without
    a trained model. `truth[i]` is the token at absolute position i.
    """

    def __init__(self, truth: list[int], block_size: int = 6, error_rate: float = 0.3, seed: int = 0,
                 vocab: int = 100, sampled_q: bool = False):
        import random

        self.truth, self.block_size, self.error_rate = truth, block_size, error_rate
        self.rng, self.vocab, self.sampled_q = random.Random(seed), vocab, sampled_q

    def propose(self, state, anchor, k, sampling):
        from mlx_spec.drafters.base import Draft

        start = state.offset + 1
        out = []
        for pos in range(start, start + k):
            good = self.truth[pos] if pos < len(self.truth) else 0
            out.append(self.rng.randrange(self.vocab) if self.rng.random() < self.error_rate else good)
        return Draft(mx.array(out, dtype=mx.int32))


class SelfDrafter:
    """Drafts by sampling the target itself at a distorted temperature, so q != p but overlaps it.

    mode: "sampled" (honest q), "argmax-onehot" (argmax drafts, q=None: lossless),
    "argmax-softq" (argmax drafts reported with a soft q: the classic bug, must be caught).
    """

    tap_ids = ()

    def __init__(self, model, block_size: int = 4, distort: float = 0.6, mode: str = "sampled",
                 error_rate: float = 0.0, seed: int = 0):
        self.model, self.block_size, self.distort, self.mode = model, block_size, distort, mode
        self.error_rate, self.seed = error_rate, seed
        self._logits: dict[tuple, mx.array] = {}  # the model's last logits per sequence: the chi-square tests
        # draft from a handful of prefixes over and over, and a pass over the whole sequence each time was
        # most of their time

    def logits(self, seq: list[int]) -> mx.array:
        key = tuple(seq)
        got = self._logits.get(key)
        if got is None:
            got = self.model(mx.array([seq]))[0, -1:].astype(mx.float32) * self.distort
            if len(self._logits) < 4096:
                mx.eval(got)
                self._logits[key] = got
        return got

    class State(OracleDrafter.State):
        def __init__(self):
            super().__init__()
            self.tokens = []

        def trim(self, n):
            del self.tokens[len(self.tokens) - n:]
            return super().trim(n)

    def make_state(self):
        return self.State()

    def observe(self, state, hidden, tokens):
        state.offset += len(tokens)
        state.tokens += list(tokens)

    def propose(self, state, anchor, k, sampling):
        import random

        from mlx_spec.drafters.base import Draft

        seq, toks, qs = state.tokens + [anchor], [], []
        for _ in range(k):
            q = sampling.probs(self.logits(seq))
            t = q.argmax(-1) if self.mode.startswith("argmax") else sampling.draw(q)
            # Corruption is a function of (seed, position) alone, so a request drafts the same tokens
            # alone or in a batch, whatever the other requests did.
            rng = random.Random(self.seed * 1_000_003 + len(seq))
            toks.append(t.item() if rng.random() >= self.error_rate else rng.randrange(q.shape[-1]))
            qs.append(q)
            seq.append(toks[-1])
        q = None if self.mode == "argmax-onehot" else mx.concatenate(qs, axis=0)
        return Draft(mx.array(toks, dtype=mx.int32), q)


def make_dspark(out: Path, target_dir: Path, taps=(1, 2), block_size: int = 5, confidence: bool = True,
                threshold: float = 0.0, seed: int = 2, head_scale: float = 1.0, markov_scale: float = 1.0,
                **overrides) -> Path:
    """A random DSpark drafter in the DeepSpec layout: target config copy + DSpark keys, own embed/head copies.

    head_scale < 1 shrinks its head copy: flatter proposals, which a random drafter needs to agree
    with the target now and then. markov_scale > 1 makes each slot's proposal depend more on the
    token drawn before it (the Markov head's term)."""
    from mlx_spec.drafters.dspark import DSparkDrafter

    tcfg, mask, cfg = drafter_config(target_dir, taps, block_size)
    mx.random.seed(seed)
    model = DSparkDrafter(cfg, rank=16, confidence=confidence, with_markov=True, threshold=threshold)
    target = mx.load(str(target_dir / "model.safetensors"))
    model.embed_tokens.weight = target["model.embed_tokens.weight"]
    model.lm_head.weight = target.get("lm_head.weight", target["model.embed_tokens.weight"]) * head_scale
    model.markov_head.markov_w2.weight = model.markov_head.markov_w2.weight * markov_scale
    config = {**tcfg, "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 1, "head_dim": 16,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "num_target_layers": tcfg["num_hidden_layers"], "block_size": block_size, "mask_token_id": mask,
              "target_layer_ids": list(taps), "markov_rank": 16, "markov_head_type": "vanilla",
              "enable_confidence_head": confidence, "confidence_head_with_markov": True,
              "confidence_threshold": threshold, "tie_word_embeddings": False, **overrides}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return out


class ScriptedLengths:
    """A draft-length policy that cycles through a script (zeros included), so plain and drafting rounds
    alternate as the test chooses, whatever the controller would have picked."""

    def __init__(self, ks):
        self.ks, self.i = ks, 0

    def next(self, context=0):
        self.i += 1
        return self.ks[(self.i - 1) % len(self.ks)]

    def update(self, drafted, accepted, source=None):
        pass

    def expect(self, source):
        pass

    def interrupt(self):
        pass
