"""Explains why a weights file failed to load: truncated or corrupt safetensors / PyTorch files.

Transformers' own errors for a damaged file are low level ("[Errno 22] Invalid argument", "incomplete metadata");
[`explain_load_failure`] finds the weights files of a directory or of a repo id in the Hub cache (no download), reads
their framing and says what was expected and what was found. `register()` hands it to the REALM models, whose
`from_pretrained` raises that sentence (modeling/ itself reads no files).

[`check_hub_model`] says at once why a name that is not a local directory cannot be loaded from the Hub (not in the
cache and the Hub unreachable, no such repo, no config.json), before huggingface_hub retries each file for half a
minute and the loader reports a missing file instead.
"""

import os
import zipfile
from pathlib import Path

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .errors import ModelLoadError
from .safetensors_format import check_complete, read_file_header

CONFIG_NAME = "config.json"
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


def check_hub_model(repo_id: str, hub_kwargs: dict | None = None) -> None:
    """Returns when `repo_id` (a name that is not a local directory) can be a model on the Hub: its config.json is
    in the Hub cache, or the Hub answers for it. Otherwise raises `ModelLoadError` saying why, after one request
    (huggingface_hub itself retries each missing file for about 25 s when the network is down).

    Raises:
        ModelLoadError: offline (`HF_HUB_OFFLINE=1`, `local_files_only=True`) and not cached; the Hub unreachable; no
            such repo or revision (or a private repo without a token); a gated repo; a repo without config.json.
    """
    hub_kwargs = hub_kwargs or {}
    subfolder, revision = hub_kwargs.get("subfolder") or None, hub_kwargs.get("revision")
    filename = f"{subfolder}/{CONFIG_NAME}" if subfolder else CONFIG_NAME
    neither = f"{repo_id!r} is neither a directory here ({os.getcwd()}) nor a Hub repo"
    if isinstance(try_to_load_from_cache(repo_id, filename, cache_dir=hub_kwargs.get("cache_dir"), revision=revision),
                  str) and not hub_kwargs.get("force_download"):  # fmt: skip
        return
    if hub_kwargs.get("local_files_only") or constants.is_offline_mode():
        raise ModelLoadError(f"{neither} in the Hub cache (offline: HF_HUB_OFFLINE=1 or local_files_only). Give a model "
                             "directory, or download the repo while online.")  # fmt: skip
    url = hf_hub_url(repo_id, CONFIG_NAME, subfolder=subfolder, revision=revision)
    try:
        get_hf_file_metadata(url, token=hub_kwargs.get("token"))
    except GatedRepoError as error:
        raise ModelLoadError(f"the Hub repo {repo_id!r} is gated: accept its terms on the Hub and log in "
                             f"(`hf auth login`) ({error.server_message or error})") from None  # fmt: skip
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{neither} (or the repo is private: log in with `hf auth login`).") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"the Hub repo {repo_id!r} has no revision {revision!r}.") from None
    except EntryNotFoundError:
        raise ModelLoadError(f"the Hub repo {repo_id!r} has no {filename}: it holds no Transformers model.") from None
    except HfHubHTTPError:
        return  # the Hub answered with another error (rate limit, 5xx): the loader retries and reports it
    except Exception as error:  # the HTTP client's network errors (DNS, refused, timeout); their classes vary
        raise ModelLoadError(f"{neither} in the Hub cache, and the Hub could not be reached ({type(error).__name__}: "
                             f"{error}).") from None  # fmt: skip


__all__ = [
    "HUB_KWARGS",
    "WEIGHT_FILES",
    "check_hub_model",
    "describe_damaged_weights",
    "explain_load_failure",
    "find_weight_files",
]
