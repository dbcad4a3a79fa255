"""mlx-spec: lossless speculative decoding on MLX."""

from .calibrate import CostCurve, cost_curve
from .chat_template import UntrustedSpecialTokens, encode_chat
from .engine.cache import PromptCache
from .engine.sampling import SamplingParams
from .errors import ContextOverflowError, DrafterMismatchError, LoadError, MlxSpecError
from .generate import (Generation, GenerationResponse, SpecStats, check_block_size, encode_prompt, generate,
                       make_generation, make_prompt_cache, step_all, stream_generate)
from .loading import load

__version__ = "0.1.0"
__all__ = [
    "load", "generate", "stream_generate", "make_prompt_cache", "GenerationResponse", "SpecStats",
    "Generation", "make_generation", "step_all", "encode_prompt", "encode_chat", "check_block_size",
    "cost_curve", "CostCurve", "UntrustedSpecialTokens",
    "SamplingParams", "PromptCache", "MlxSpecError", "LoadError", "DrafterMismatchError", "ContextOverflowError",
]
