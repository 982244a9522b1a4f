"""Where realm_hf keeps what it builds or fetches for the user: $REALM_HF_HOME, else $XDG_CACHE_HOME/realm_hf.

Its own module, importing nothing of the package, so that every layer (data, retrieval, pipelines) can find its cache
without importing the default model's loading code.
"""

import os
from pathlib import Path

__all__ = ["realm_hf_home"]


def realm_hf_home() -> Path:
    """$REALM_HF_HOME, else $XDG_CACHE_HOME/realm_hf (~/.cache/realm_hf)."""
    home = os.environ.get("REALM_HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "realm_hf"
    )
    return Path(home)
