"""Explains why a weights file failed to load: truncated or corrupt safetensors / PyTorch files.

Transformers' own errors for a damaged file are low level ("[Errno 22] Invalid argument", "incomplete metadata");
[`explain_load_failure`] finds the weights files of a directory or of a repo id in the Hub cache (no download), reads
their framing and says what was expected and what was found. `register()` hands it to the REALM models, whose
`from_pretrained` raises that sentence (modeling/ itself reads no files).
"""

import os
import zipfile
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from .safetensors_format import check_complete, read_file_header

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# The `from_pretrained` keyword arguments that say where files come from on the Hub.
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def find_weight_files(name_or_path: str | os.PathLike, subfolder: str = "", revision: str | None = None) -> list[Path]:
    """The weights files of a local directory or of a repo id already in the Hub cache (no download)."""
    directory = Path(name_or_path) / subfolder
    if directory.is_dir():
        return [directory / name for name in WEIGHT_FILES if (directory / name).is_file()]
    found = []
    for name in WEIGHT_FILES:
        cached = try_to_load_from_cache(str(name_or_path), os.path.join(subfolder, name) if subfolder else name,
                                        revision=revision)  # fmt: skip
        if isinstance(cached, str):
            found.append(Path(cached))
    return found


def describe_damaged_weights(path: Path) -> str | None:
    """A sentence naming what is wrong with `path`, or `None` when its framing is intact."""
    size = path.stat().st_size
    fix = f"Download it again (from_pretrained(..., force_download=True)) or re-save the model; file: {path}"
    if path.suffix == ".safetensors":
        try:
            data_start, header, size = read_file_header(path)
            check_complete(header, data_start, size, path.name)
        except (ValueError, KeyError, TypeError, IndexError) as error:
            return f"{error}. {fix}"
        return None
    if path.suffix == ".bin":
        if not zipfile.is_zipfile(path):
            return (
                f"{path.name} is not a complete PyTorch checkpoint: expected a zip archive (torch.save format), found "
                f"{size} bytes without a readable archive directory, typically a truncated download. {fix}"
            )
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
        if broken is not None:
            return f"{path.name} is corrupt: the archive member {broken!r} fails its checksum. {fix}"
    return None


def explain_load_failure(
    name_or_path: str | os.PathLike, subfolder: str = "", revision: str | None = None
) -> str | None:
    """Why loading weights from `name_or_path` failed, when a damaged weights file explains it; else `None`."""
    for path in find_weight_files(name_or_path, subfolder, revision):
        problem = describe_damaged_weights(path)
        if problem is not None:
            return problem
    return None


__all__ = ["HUB_KWARGS", "WEIGHT_FILES", "describe_damaged_weights", "explain_load_failure", "find_weight_files"]
