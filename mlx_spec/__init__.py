"""mlx-spec: lossless speculative decoding on MLX."""

from .engine.cache import PromptCache
from .engine.sampling import SamplingParams
from .errors import ContextOverflowError, DrafterMismatchError, LoadError, MlxSpecError
from .generate import GenerationResponse, SpecStats, generate, make_prompt_cache, stream_generate
from .loading import load

__version__ = "0.1.0"
__all__ = [
    "load", "generate", "stream_generate", "make_prompt_cache", "GenerationResponse", "SpecStats",
    "SamplingParams", "PromptCache", "MlxSpecError", "LoadError", "DrafterMismatchError", "ContextOverflowError",
]
