"""Where bertforge keeps what it caches (corpora given in memory, the default pretraining corpus): one rule."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_VAR = "BERTFORGE_CACHE"


def cache_dir() -> Path:
    """$BERTFORGE_CACHE, else $XDG_CACHE_HOME/bertforge (~/.cache/bertforge)."""
    if os.environ.get(CACHE_VAR):
        return Path(os.environ[CACHE_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertforge"
