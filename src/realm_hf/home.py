"""Where realm_hf keeps what it builds or fetches for the user: $REALM_HF_HOME, else $XDG_CACHE_HOME/realm_hf; and
[`kept`], the one way an entry there is read back, rebuilt when damaged, and written.

Its own module, importing nothing of the package, so that every layer (data, retrieval, pipelines) can find its cache
without importing the default model's loading code.
"""

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["kept", "kept_for_corpus", "realm_hf_home"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def realm_hf_home() -> Path:
    """$REALM_HF_HOME, else $XDG_CACHE_HOME/realm_hf (~/.cache/realm_hf)."""
    home = os.environ.get("REALM_HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "realm_hf"
    )
    return Path(home)


def kept(
    path: Path, read: Callable[[Path], T], build: Callable[[], T], write: Callable[[T, Path], None], what: str
) -> T:
    """`read(path)` where the entry `path` exists; else `build()`, kept with `write(value, path)` for the next time.

    An entry that cannot be read (damaged, of another format) is built again and replaced, with a warning; a home that
    cannot be written costs the next start a rebuild, with a warning, and nothing else. `write` must write atomically
    (the entry appears whole or not at all): `path`'s parent exists when it is called. `what` names the value in the
    warnings ("the BM25 index")."""
    if path.exists():
        try:
            return read(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            logger.warning(f"Rebuilding {what}: could not read {path} ({error})")
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(value, path)
    except OSError as error:
        logger.warning(f"Could not keep {what} in {path}: {error}")
    return value


def kept_for_corpus(
    records,
    folder: str,
    variant: str,
    build: Callable[[], T],
    encode: Callable[[T], object],
    decode: Callable[[object], T],
    what: str,
) -> T:
    """`build()`, a value worked out from a corpus' block records, kept as JSON in
    `$REALM_HF_HOME/<folder>/<fingerprint>-<variant>.json` where the records come from a document store (whose
    fingerprint names the corpus, `records.store.fingerprint()`): built once, read back after. Other records are built
    each time. `encode` turns the value into what `json` writes, `decode` turns that back; `variant` names whatever
    else the value depends on (titles read or not, the rules that built it), `what` the value in warnings."""
    store = getattr(records, "store", None)
    fingerprint = getattr(store, "fingerprint", None)
    if not callable(fingerprint):
        return build()
    from .atomic import atomic_write_bytes

    def read(path: Path) -> T:
        return decode(json.loads(path.read_text(encoding="utf-8")))

    def write(value: T, path: Path) -> None:
        atomic_write_bytes(path, json.dumps(encode(value)).encode("utf-8"))

    return kept(realm_hf_home() / folder / f"{fingerprint()}-{variant}.json", read, build, write, what)
