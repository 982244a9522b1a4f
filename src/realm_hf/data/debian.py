"""Data files from Debian packages, fetched at run time without installing anything.

[`fetch_debian_packages`] downloads packages with `apt-get download` (no root needed) and unpacks them with
`dpkg-deb -x` into one cache directory, once: the unpacked tree appears whole or not at all, so an interrupted fetch
leaves nothing half-written behind. The bsdgames quiz files ([`~realm_hf.data.quiz`]) and the two Bible translations
([`~realm_hf.data.bible`]) come this way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

__all__ = ["fetch_debian_packages"]


def fetch_debian_packages(packages: Sequence[str], wanted: Sequence[str | Path], cache_dir: str | os.PathLike) -> Path:
    r"""
    Unpacks Debian packages into `cache_dir` (downloading them the first time) and returns `cache_dir`.

    Args:
        packages (`Sequence[str]`): package names, e.g. `["bible-kjv", "bible-kjv-text"]`.
        wanted (`Sequence[str | Path]`): paths relative to the unpacked root that must exist afterwards (files or
            directories); when they all exist already nothing is downloaded.
        cache_dir (`str` or `os.PathLike`): where the packages are unpacked.

    Raises:
        RuntimeError: `apt-get` or `dpkg-deb` is missing (not a Debian-family system), the download failed, or the
            packages do not hold `wanted`; the message says how to get the files by hand.
    """
    cache = Path(cache_dir)
    if all((cache / path).exists() for path in wanted):
        return cache
    names = " ".join(packages)
    manual = (f"get them by hand on a Debian or Ubuntu machine: `apt-get download {names}`, then `dpkg-deb -x` each "
              f".deb into {cache} (run `apt-get update` first if a package is not found)")  # fmt: skip
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the files of {names} need `{tool}`, which is not on PATH; {manual}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as download:
        logger.info("Downloading %s with apt-get into %s", names, download)
        result = subprocess.run(["apt-get", "download", *packages], cwd=download, capture_output=True, text=True)
        debs = {package: sorted(Path(download).glob(f"{package}_*.deb")) for package in packages}
        missing = [package for package, found in debs.items() if not found]
        if result.returncode != 0 or missing:
            raise RuntimeError(f"`apt-get download {names}` failed (exit code {result.returncode}, missing: "
                               f"{missing}): {result.stderr.strip()[-500:]}; {manual}")  # fmt: skip
        unpacked = Path(download) / "root"
        for found in debs.values():
            result = subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(unpacked)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"`dpkg-deb -x {found[-1].name}` failed: {result.stderr.strip()[-500:]}; {manual}")
        absent = [str(path) for path in wanted if not (unpacked / path).exists()]
        if absent:
            raise RuntimeError(f"the packages {names} do not hold {absent}; {manual}")
        # Move each top-level entry in place (the unpacked tree appears whole or not at all per entry).
        for entry in unpacked.iterdir():
            target = cache / entry.name
            if target.exists():
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            os.replace(entry, target)
    return cache
