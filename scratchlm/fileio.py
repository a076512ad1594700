"""Where scratchlm keeps files of its own: the cache folder. Nothing here imports the rest of
the package, so every module may import it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """scratchlm's cache folder: $SCRATCHLM_CACHE, else ~/.cache/scratchlm. Prepared data goes in
    its data/ (scratchlm.data.cache_root), the compiled decoding kernels in kernels/, the measured
    CPU matmul peak in cpu_peak.json."""
    env = os.environ.get("SCRATCHLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "scratchlm"
