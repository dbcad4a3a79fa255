import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import factory  # noqa: E402


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tokenizer_dir(models_dir) -> Path:
    return factory.make_tokenizer(models_dir / "tokenizer")


@pytest.fixture(scope="session")
def target_dir(models_dir, tokenizer_dir) -> Path:
    return factory.make_target(models_dir / "qwen3", tokenizer_dir, "qwen3")


@pytest.fixture(scope="session")
def drafter_dir(models_dir, target_dir) -> Path:
    return factory.make_drafter(models_dir / "qwen3-dflash", target_dir)
