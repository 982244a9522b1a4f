"""The project's exceptions. Each is also a `ValueError` or an `OSError`, so code written against the built-in types
keeps catching them; the command line maps them to exit codes in one place (`realm_hf.cli.main`).

    RealmHfError                      base of everything below (never raised itself)
    ├── UsageError (ValueError)       the command line asks for something that cannot be done: exit code 2
    ├── InputError (ValueError)       a question, value or argument the API cannot use (blank question, bad ids, ...)
    ├── FileFormatError (ValueError)  a user file is malformed: names the file and, where known, the line or byte
    │   ├── IndexMismatchError        the parts of an index disagree (documents vs embedding rows, dims)
    │   └── MissingColumnError        a file of rows lacks the text column asked for (`column`, and the `found` ones)
    ├── MissingFileError (FileNotFoundError)  a path the user named does not exist
    └── ModelLoadError (OSError)      a model (directory or Hub repo id) could not be loaded: says why

Every message says what was expected and what was received, in one line.
"""

import os


class RealmHfError(Exception):
    """Base of the project's exceptions."""


class UsageError(RealmHfError, ValueError):
    """The command line asks for something that cannot be done (no questions, conflicting options)."""


class InputError(RealmHfError, ValueError):
    """A question, value or argument that the library cannot use."""


class FileFormatError(RealmHfError, ValueError):
    """A file the user gave is malformed or not of the expected kind. The message names the file; `path` holds it
    and `location` where in it ("line 3", "byte 17"), when known."""

    def __init__(self, message: str, *, path=None, location: str | None = None):
        self.path, self.location = (str(path) if path is not None else None), location
        super().__init__(message)


class IndexMismatchError(FileFormatError):
    """The parts of an index (documents, embedding shards, manifest) disagree, or the index and the model reading it
    (embeddings of another size: another model's index)."""


class MissingColumnError(FileFormatError):
    """A file of rows has no text column of the name asked for: `column` is that name, `found` the file's columns
    (the command line then names its --text-column option)."""

    def __init__(self, message: str, *, column: str, found, path=None):
        self.column, self.found = column, list(found)
        super().__init__(message, path=path)


class MissingFileError(RealmHfError, FileNotFoundError):
    """A file or directory the user named does not exist."""


class ModelLoadError(RealmHfError, OSError):
    """A model could not be loaded from the directory or Hub repo id given; the message says why."""


def missing_index_error(option: str, index) -> MissingFileError:
    """The error for an index directory that does not exist, worded alike where the command line checks it (before
    torch loads) and where the library opens the index. `option` names how it was given ("--index")."""
    # index.json is `realm_hf.loading.INDEX_MANIFEST`, not imported: this module imports nothing heavy
    return MissingFileError(f"{option} {str(index)!r}: no such directory (expected an index directory written by "
                            "`realm-hf index build`, holding index.json)")  # fmt: skip


def missing_model_error(option: str, value: str) -> MissingFileError | None:
    """The error for a model name that is no directory here and cannot be a Hub repo id either (`name` or
    `owner/name`): an absolute or relative path, `~`, more than one `/`, a backslash. `None` where it can be a repo id,
    which the Hub then answers for. Worded alike where the command line checks `--model` (before torch loads) and
    where the library loads a model; `option` names how it was given."""
    if os.path.isabs(value) or value.startswith((".", "~")) or value.count("/") > 1 or "\\" in value:
        return MissingFileError(f"{option} {value!r}: no such directory (expected a model directory or a Hub repo id)")
    return None


def not_utf8_error(
    name: str | None, data: bytes, position: int, *, offset: int = 0, line: int | None = None, path=None,
    hint: str = " (save the file as UTF-8)",
) -> FileFormatError:  # fmt: skip
    """The error for bytes that are not UTF-8, worded alike wherever they are read: "notes.jsonl line 2: expected UTF-8
    text, received byte 0xe9 at byte offset 54 (save the file as UTF-8)". `data[position]` is the first bad byte;
    `offset` is where `data` starts in the file, and `line` the line `data` starts on (counted in `data` when not
    given: `data` is the whole file)."""
    if line is None:
        line = data.count(b"\n", 0, position) + 1
    where = f"{name} line {line}" if name else f"line {line}"
    return FileFormatError(f"{where}: expected UTF-8 text, received byte 0x{data[position]:02x} at byte offset "
                           f"{offset + position}{hint}", path=path, location=f"line {line}")  # fmt: skip


__all__ = [
    "FileFormatError",
    "IndexMismatchError",
    "InputError",
    "MissingColumnError",
    "MissingFileError",
    "ModelLoadError",
    "RealmHfError",
    "UsageError",
    "not_utf8_error",
]
