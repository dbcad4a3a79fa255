"""What the routes share: config, the scheduler and its backend, metrics, the prompt builder."""

from __future__ import annotations

from dataclasses import dataclass, field

from .backend import Backend, ModelInfo
from .config import ServerConfig
from .errors import APIError
from .metrics import Metrics
from .prompt import PromptBuilder
from .scheduler import Scheduler


@dataclass
class ServerState:
    config: ServerConfig
    backend: Backend
    scheduler: Scheduler
    metrics: Metrics
    _prompts: PromptBuilder | None = field(default=None, repr=False)

    @classmethod
    def build(cls, config: ServerConfig, backend: Backend | None = None) -> "ServerState":
        """`backend`: one built elsewhere (serve --distributed); default: this process loads the model."""
        backend, metrics = backend or Backend(config.model, config.prefix_cache_size), Metrics()
        scheduler = Scheduler(backend, metrics, config.max_active, config.max_queue, config.retry_after, config.learn)
        return cls(config, backend, scheduler, metrics)

    @property
    def status(self) -> str:
        if self.scheduler.load_error is not None:
            return "error"
        if not self.scheduler.ready.is_set():
            return "loading"
        return "shutting_down" if self.scheduler.closed else "ok"

    def require_ready(self) -> None:
        status = self.status
        if status != "ok":
            message = {"loading": "the model is still loading", "shutting_down": "the server is shutting down",
                       "error": f"the model failed to load: {self.scheduler.load_error}"}[status]
            raise APIError(503, message, code=status, headers={"Retry-After": str(self.config.retry_after)})

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    @property
    def tokenizer(self):
        return self.backend.tokenizer

    @property
    def prompts(self) -> PromptBuilder:
        if self._prompts is None:
            self._prompts = PromptBuilder(self.backend.tokenizer, self.backend.info)
        return self._prompts
