import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import factory  # noqa: E402

# Calibration caches and chat history go to a throwaway folder, never the user's home.
os.environ.setdefault("MLX_SPEC_CACHE", tempfile.mkdtemp(prefix="mlx-spec-cache-"))


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


@pytest.fixture(scope="session")
def long_target_dir(models_dir, target_dir) -> Path:
    """The test target with a 4096-token window: room for generations that outlast a test's actions."""
    import json
    import shutil

    out = models_dir / "qwen3-long"
    if not out.exists():
        shutil.copytree(target_dir, out)
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}, indent=2))
    return out
