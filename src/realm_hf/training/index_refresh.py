"""Index refresh for REALM pretraining: re-embed the corpus with the latest embedder while training goes on.

REALM's retriever changes every step, but the index of block embeddings that chooses the candidates is only
rebuilt now and then (the paper: every ~500 steps, by a separate job). [`IndexRefresher`] does that in one of two
modes, over a work directory that also makes the hand-over visible and resumable:

    WORK_DIR/snapshots/step-00000100/   block-embedder weights + tokenizer, published by the trainer (main process)
    WORK_DIR/indexes/step-00000100/     the corpus embedded with those weights (an index directory, see index_files)
    WORK_DIR/refresh_log.jsonl          one line per index built: step, seconds, mode
    WORK_DIR/documents/                 async: the corpus as a document store, where `documents_dir` does not hold it

- `mode="sync"`: every `every` steps all training processes stop, re-embed the corpus together (`build_index` shards
  it over the ranks) and continue with the new index. Deterministic: the mode for tests and for comparisons.
- `mode="async"`: every `every` steps the main process publishes a snapshot unless the refresher is still busy with
  the previous one; a background process (spawned once, `threads` CPU threads or its own GPU) embeds the newest
  snapshot into a new index while training continues. At the next multiple of `every` after it lands, all ranks agree
  on the newest complete index (a broadcast from the main process) and swap to it at the same step.

Both write each index to a hidden partial directory renamed into place when complete, so a crash never leaves a
half index that looks whole; a restarted run reuses the newest index that is not newer than its checkpoint.
"""

import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import torch
from transformers.utils import logging

from ..errors import RealmHfError
from ..retrieval.distributed import process_state

logger = logging.get_logger(__name__)

_STEP_FORMAT = "step-{:08d}"
_STOP_FILE = "STOP"
# Variables that would make the background process join the trainer's process group.
_DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # fmt: skip


def _steps_in(directory: Path) -> list[int]:
    """The steps of the complete `step-XXXXXXXX` entries of `directory`, ascending."""
    if not directory.is_dir():
        return []
    steps = []
    for entry in directory.iterdir():
        if entry.name.startswith("step-") and entry.name[5:].isdigit():
            steps.append(int(entry.name[5:]))
    return sorted(steps)


class IndexRefresherError(RealmHfError, RuntimeError):
    """The background index refresher process ended before training did (`exitcode`: its exit code); its traceback is
    in the output above."""

    def __init__(self, message: str, *, exitcode: int | None = None):
        self.exitcode = exitcode
        super().__init__(message)


def _store_fingerprint(directory: Path | None) -> str | None:
    """The fingerprint recorded in the manifest of the document store `directory`; None where it is no store."""
    from ..retrieval.document_store import MANIFEST_NAME

    if directory is None:
        return None
    try:
        manifest = json.loads((Path(directory) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest.get("fingerprint") if isinstance(manifest, dict) else None


def _load_searcher(directory: Path):
    from ..retrieval.torch_search import ExactSearcher

    return ExactSearcher.from_index(directory)


def _build(embedder, tokenizer, documents, indexes: Path, step: int, batch_size: int, max_length: int, mode: str,
           log_path: Path, precision: str = "fp32") -> Path:  # fmt: skip
    """Embeds `documents` into `indexes/step-N` through a partial directory; returns the final path. Every process
    of the current process group must call it (the shards are split over them)."""
    from ..retrieval.index_builder import build_index

    state = process_state()
    final = indexes / _STEP_FORMAT.format(step)
    partial = indexes / f".{final.name}.partial"
    if state.is_main_process:
        # A partial build left by a killed run was made with other weights: never resume it.
        shutil.rmtree(partial, ignore_errors=True)
    state.wait_for_everyone()
    started = time.time()
    build_index(embedder, tokenizer, documents, partial, batch_size=batch_size, max_length=max_length,
                provenance={"refreshed_at_step": step}, progress=False, precision=precision)  # fmt: skip
    if state.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"step": step, "seconds": round(time.time() - started, 3), "mode": mode}) + "\n")
    state.wait_for_everyone()
    return final


def _prune(indexes: Path, keep: int) -> None:
    for step in _steps_in(indexes)[:-keep]:
        shutil.rmtree(indexes / _STEP_FORMAT.format(step), ignore_errors=True)


class IndexRefresher:
    r"""
    Keeps REALM's index of block embeddings fresh during pretraining (see the module docstring for the two modes).

    Args:
        work_dir (`str` or `Path`): where snapshots, indexes and the refresh log live (created).
        tokenizer (`RealmTokenizer`): the embedder's tokenizer (saved with each snapshot).
        mode (`str`, defaults to `"async"`): `"async"` (background process) or `"sync"` (in the training processes).
        every (`int`, defaults to 100): act every this many optimizer steps (REALM: about 500).
        documents_dir (`str` or `Path`, *optional*): a `DocumentStore` directory holding the corpus trained on, for
            the background process (`"async"`) to read. Where it is not given, or holds another corpus (another
            fingerprint) or no store (a JSONL file, a folder of text files), the corpus handed to [`start`] is saved as
            a store in `work_dir/documents/` (kept for later runs while it matches) and read from there.
        batch_size (`int`, defaults to 64), max_length (`int`, defaults to 288): embedding batches and truncation
            (use the index's settings).
        keep (`int`, defaults to 3): indexes kept on disk (the newest ones).
        threads (`int`, *optional*): CPU threads of the background process (default: half the cores).
        final_refresh (`bool`, defaults to True): when training ends, build (and wait for) an index from the final
            weights, so that the run leaves an index that matches its embedder.
        precision (`str`, defaults to "fp32"): how the corpus is embedded, as `build_index`'s `precision` ("bf16":
            under bf16 autocast, embeddings stored in fp32; "auto": bf16 where the device has native bf16).
    """

    def __init__(self, work_dir: str | os.PathLike, tokenizer, *, mode: str = "async", every: int = 100,
                 documents_dir: str | os.PathLike | None = None, batch_size: int = 64, max_length: int = 288,
                 keep: int = 3, threads: int | None = None, final_refresh: bool = True,
                 poll_seconds: float = 0.2, precision: str = "fp32"):  # fmt: skip
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}.")
        if every < 1 or keep < 1:
            raise ValueError(f"every and keep must be >= 1, got {every} and {keep}.")
        self.work_dir = Path(work_dir)
        self.tokenizer = tokenizer
        self.mode = mode
        self.every = every
        self.documents_dir = None if documents_dir is None else Path(documents_dir)
        self.batch_size = batch_size
        self.max_length = max_length
        self.keep = keep
        self.threads = threads
        self.final_refresh = final_refresh
        self.poll_seconds = poll_seconds
        self.precision = precision
        self.snapshots = self.work_dir / "snapshots"
        self.indexes = self.work_dir / "indexes"
        self.log_path = self.work_dir / "refresh_log.jsonl"
        self._documents = None
        self._documents_for_process = None
        self._process = None
        self._last_step = None

    # -- called by the trainer ----------------------------------------------------------------------------------------

    def start(self, documents, resume_step: int = 0):
        """Prepares the work directory (main process) and, in async mode, starts the background process. Returns
        `(searcher, step)` of the newest index not newer than `resume_step` when one exists (a resumed run), else
        `None`."""
        state = process_state()
        self._documents = documents
        if state.is_main_process:
            self.snapshots.mkdir(parents=True, exist_ok=True)
            self.indexes.mkdir(parents=True, exist_ok=True)
            (self.work_dir / _STOP_FILE).unlink(missing_ok=True)
            for stale in self.snapshots.iterdir():  # unconsumed snapshots of an earlier run
                shutil.rmtree(stale, ignore_errors=True)
            for partial in self.indexes.glob(".*.partial"):
                shutil.rmtree(partial, ignore_errors=True)
            for newer in [step for step in _steps_in(self.indexes) if step > resume_step]:
                shutil.rmtree(self.indexes / _STEP_FORMAT.format(newer))  # made by weights the checkpoint lacks
            if self.mode == "async":
                self._documents_for_process = self._saved_documents(documents)
                self._spawn()
        state.wait_for_everyone()
        steps = _steps_in(self.indexes)
        self._last_step = steps[-1] if steps else None
        return None if not steps else (_load_searcher(self.indexes / _STEP_FORMAT.format(steps[-1])), steps[-1])

    def step(self, embedder, step: int, current_step: int | None = None):
        """Called by every process after each optimizer step. Every `every` steps it refreshes (sync) or publishes a
        snapshot (async) and returns `(searcher, index_step)` when a newer index than `current_step` is ready."""
        if step % self.every:
            return None
        if self.mode == "sync":
            self._build_now(embedder, step)
        else:
            self._check_process()
            if process_state().is_main_process and not any(self.snapshots.iterdir()):
                self._publish(embedder, step)  # only when the refresher has taken the previous one
        return self._newest_if_newer(current_step)

    def close(self, embedder, step: int):
        """Ends refreshing: with `final_refresh`, builds an index from the final weights and waits for it; stops the
        background process. Returns `(searcher, step)` of the newest index if newer than the last one handed out."""
        state = process_state()
        if self.final_refresh and self._last_step != step and step not in _steps_in(self.indexes):
            if self.mode == "sync":
                self._build_now(embedder, step)
            else:
                self._check_process()
                if state.is_main_process:
                    self._publish(embedder, step, replace=True)
                    self._wait_for(step)
                state.wait_for_everyone()
        if state.is_main_process and self._process is not None:
            (self.work_dir / _STOP_FILE).touch()
            self._process.join(timeout=60)
            if self._process.is_alive():
                self._process.terminate()
            self._process = None
        state.wait_for_everyone()
        return self._newest_if_newer(self._last_step)

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _build_now(self, embedder, step: int) -> None:
        if step not in _steps_in(self.indexes):
            _build(embedder, self.tokenizer, self._documents, self.indexes, step, self.batch_size, self.max_length,
                   "sync", self.log_path, self.precision)  # fmt: skip
        if process_state().is_main_process:
            _prune(self.indexes, self.keep)
        process_state().wait_for_everyone()

    def _publish(self, embedder, step: int, replace: bool = False) -> None:
        """Writes the embedder + tokenizer as `snapshots/step-N`, atomically (a renamed directory)."""
        final = self.snapshots / _STEP_FORMAT.format(step)
        if replace:  # the refresher should skip whatever it has not started yet
            for older in self.snapshots.iterdir():
                if older != final:
                    shutil.rmtree(older, ignore_errors=True)
        if final.exists():
            return
        partial = self.snapshots.parent / f".snapshot-{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        embedder.save_pretrained(partial)
        self.tokenizer.save_pretrained(partial)
        os.replace(partial, final)

    def _newest_if_newer(self, current_step: int | None):
        newest = None
        state = process_state()
        if state.is_main_process:
            steps = _steps_in(self.indexes)
            newest = steps[-1] if steps else None
        if state.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            newest = broadcast_object_list([newest])[0]
        if newest is None or (current_step is not None and newest <= current_step):
            return None
        self._last_step = newest
        return _load_searcher(self.indexes / _STEP_FORMAT.format(newest)), newest

    def _saved_documents(self, documents) -> Path:
        """The document store directory holding `documents` for the background process to read: `documents_dir`
        where its fingerprint is that of `documents`, else `work_dir/documents/` (saved there now unless it holds them
        already)."""
        fingerprint = getattr(documents, "fingerprint", None)
        if not callable(fingerprint) or not hasattr(documents, "save"):
            if self.documents_dir is None:
                raise ValueError(f"mode='async' needs documents_dir (a DocumentStore directory the background process "
                                 f"reads) for documents that are no DocumentStore, got {type(documents).__name__}.")  # fmt: skip
            return self.documents_dir
        wanted, copy = fingerprint(), self.work_dir / "documents"
        if _store_fingerprint(self.documents_dir) == wanted:
            return self.documents_dir
        if _store_fingerprint(copy) != wanted:
            if self.documents_dir is not None:
                logger.warning(f"documents_dir {self.documents_dir} does not hold the corpus trained on (no document "
                               f"store of its {len(documents)} documents): the index refresher reads a copy saved in "
                               f"{copy}")  # fmt: skip
            documents.save(copy)
        return copy

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(
            target=refresh_loop,
            kwargs={"work_dir": str(self.work_dir), "documents_dir": str(self._documents_for_process),
                    "batch_size": self.batch_size, "max_length": self.max_length, "keep": self.keep,
                    "threads": self.threads, "poll_seconds": self.poll_seconds, "parent_pid": os.getpid(),
                    "precision": self.precision},
            daemon=True,
            name="realm-index-refresher",
        )  # fmt: skip
        self._process.start()

    def _check_process(self) -> None:
        if self._process is not None and not self._process.is_alive():
            code = self._process.exitcode
            raise IndexRefresherError(f"the index refresher process exited with code {code} (its traceback is above); "
                                      "restart the run to resume, or refresh in the training processes "
                                      "(mode='sync')", exitcode=code)  # fmt: skip

    def _wait_for(self, step: int) -> None:
        while step not in _steps_in(self.indexes):
            self._check_process()
            time.sleep(self.poll_seconds)


def refresh_loop(work_dir: str, documents_dir: str, batch_size: int = 64, max_length: int = 288, keep: int = 3,
                 threads: int | None = None, poll_seconds: float = 0.2, parent_pid: int | None = None,
                 precision: str = "fp32") -> None:  # fmt: skip
    r"""
    The background refresher: embeds the newest snapshot in `work_dir/snapshots` into `work_dir/indexes/step-N`,
    removes the snapshot, and repeats until `work_dir/STOP` exists (or its parent process is gone). Can also run on
    its own (e.g. on another GPU or machine sharing the directory): `python -c "from realm_hf.training.index_refresh
    import refresh_loop; refresh_loop('WORK_DIR', 'DOCUMENTS_DIR')"`.
    """
    for name in _DISTRIBUTED_ENV:  # a standalone process, not a member of the trainer's process group
        os.environ.pop(name, None)
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))
    from ..modeling import RealmEmbedder, RealmTokenizer
    from ..retrieval.document_store import DocumentStore

    work = Path(work_dir)
    snapshots, indexes = work / "snapshots", work / "indexes"
    documents = DocumentStore.load(documents_dir)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    while True:
        steps = _steps_in(snapshots)
        if not steps:
            if (work / _STOP_FILE).exists() or (parent_pid is not None and os.getppid() != parent_pid):
                return
            time.sleep(poll_seconds)
            continue
        step = steps[-1]
        snapshot = snapshots / _STEP_FORMAT.format(step)
        try:
            embedder = RealmEmbedder.from_pretrained(snapshot).to(device).eval()
            tokenizer = RealmTokenizer.from_pretrained(snapshot)
        except (OSError, ValueError):  # the trainer replaced this snapshot with a newer one meanwhile
            if snapshot.exists():
                raise
            continue
        _build(embedder, tokenizer, documents, indexes, step, batch_size, max_length, "async",
               work / "refresh_log.jsonl", precision)  # fmt: skip
        for done in steps:
            shutil.rmtree(snapshots / _STEP_FORMAT.format(done), ignore_errors=True)
        _prune(indexes, keep)


__all__ = ["IndexRefresher", "IndexRefresherError", "refresh_loop"]
