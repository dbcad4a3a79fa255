"""Embedded models and the registry of known target <-> drafter pairs."""

import json
from pathlib import Path

HERE = Path(__file__).parent
DEFAULT_TARGET = HERE / "default" / "target"
DEFAULT_TARGET_8BIT = HERE / "default" / "target-8bit"
DEFAULT_DRAFTER = HERE / "default" / "drafter"


def registry() -> dict:
    """Known pairs: {"pairs": [{"target": repo or name, "drafter": repo or path, "kind": ...}]}."""
    return json.loads((HERE / "registry.json").read_text())
