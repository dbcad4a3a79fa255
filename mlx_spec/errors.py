"""Errors a user can act on. Each prints as one clear line (see `cli.main`)."""


class MlxSpecError(Exception):
    """Base class: a problem with the user's input, not a bug."""


class LoadError(MlxSpecError):
    """A model or drafter folder is missing, corrupt or of an unknown kind."""


class DrafterMismatchError(LoadError):
    """The drafter does not fit the target it was paired with."""


class ContextOverflowError(MlxSpecError):
    """The prompt plus the requested tokens exceed the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context: int):
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context
        super().__init__(
            f"prompt of {prompt_tokens} tokens does not fit the context window of {context} tokens"
            + (f" (with max_tokens={max_tokens})" if max_tokens else "")
        )
