"""mlx-spec: lossless speculative decoding on MLX.

The public names load on first use: `mlx-spec` re-executes itself once with an optimized BLAS
preloaded, and importing MLX, mlx-lm and transformers before that cost ~2 s for nothing.
"""

import sys
import types
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    ".calibrate": ["CostCurve", "cost_curve"],
    ".chat_template": ["UntrustedSpecialTokens", "encode_chat"],
    ".engine.cache": ["PromptCache"],
    ".engine.params": ["SamplingParams"],
    ".errors": ["ContextOverflowError", "DrafterMismatchError", "LoadError", "MlxSpecError"],
    ".generate": ["Generation", "GenerationResponse", "SpecStats", "check_block_size", "encode_prompt", "generate",
                  "make_generation", "make_prompt_cache", "step_all", "stream_generate"],
    ".loading": ["load"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_WHERE)


class _Package(types.ModuleType):
    def __getattr__(self, name: str):
        if name not in _WHERE:
            raise AttributeError(f"module 'mlx_spec' has no attribute {name!r}")
        value = getattr(import_module(_WHERE[name], __name__), name)
        self.__dict__[name] = value  # later lookups skip this method
        return value

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *__all__})

    # `mlx_spec.generate` is the function, as it always was, though a submodule has that name too:
    # importing the submodule stores it on the package (ignored here; sys.modules keeps it).
    @property
    def generate(self):
        return import_module(".generate", __name__).generate

    @generate.setter
    def generate(self, _module) -> None:
        pass


sys.modules[__name__].__class__ = _Package
