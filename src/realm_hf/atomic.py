"""Atomic file writes: a crash or `kill -9` leaves either the old file or the complete new one, never half of one."""

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary path in `path`'s directory to write to. On success the file is fsynced, given the usual
    permissions (0666 less the umask, not mkstemp's 0600) and renamed onto `path`; on any error or interruption it is
    removed."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        yield temporary
        with open(temporary, "rb+") as written:
            os.fsync(written.fileno())
        usual_permissions(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def usual_permissions(path: str | os.PathLike, directory: bool = False) -> None:
    """Gives `path` the permissions a new file (0666) or directory (0777) gets, less the umask: mkstemp and mkdtemp
    make theirs private (0600, 0700), which a staged file keeps after its rename."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` atomically."""
    with atomic_path(path) as temporary, open(temporary, "wb") as writer:
        writer.write(data)


def replace_directory(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Puts the complete directory `new` in `target`'s place (a sibling: one file system), in two renames: the old
    `target` out to a hidden sibling, `new` in; then the old one is deleted. Readers see the old directory or the new
    one, never a mix; a crash between the renames leaves both, whole, as hidden siblings of `target`."""
    import shutil

    new, target = Path(new), Path(target)
    if not target.exists():
        os.replace(new, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, retired / target.name)
    os.replace(new, target)
    shutil.rmtree(retired, ignore_errors=True)


__all__ = ["atomic_path", "atomic_write_bytes", "replace_directory", "usual_permissions"]
