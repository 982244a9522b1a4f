"""What the serve tests share: a tiny open-QA pipeline over a corpus of hostile text; a live server on 127.0.0.1."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from conftest import RETRIEVAL_TEST_VOCAB, tiny_config, write_vocab
from transformers import pipeline

from realm_hf import RealmForOpenQA, RealmRetriever, RealmTokenizer
from realm_hf.retrieval import DocumentStore

# Corpus text is user input: every block holds markup that a page must show as text (an image whose onerror would run,
# a script, entities, a stray </mark>). Every title starts with a character outside the BMP (two UTF-16 units in JS,
# one character in Python), so offsets taken for UTF-16 indices would shift every highlight.
_MARKUP = '<img src=x onerror="window.injected={0}"><script>window.injected={0}</script>'
HOSTILE_RECORDS = [
    {"title": "\U0001f642 Fish & <b>chips</b>", "text": f"this is the first record, want {_MARKUP.format(1)}"},
    {"title": "\U0001f30d </p><h1>big</h1>", "text": f"{_MARKUP.format(2)} the second record is the lowest test"},
    {"title": "\U0001f4d6 &lt;escaped&gt;", "text": f"third record, {_MARKUP.format(3)} running low question"},
    {"title": "\U0001f680 a < b > c", "text": f"the fourth record </mark> the fifth unwanted {_MARKUP.format(4)}"},
    {"title": "\U0001f9ea <i>lab</i>", "text": f"this is the fifth {_MARKUP.format(5)} record; lowest question"},
    {"title": "\U0001f4a1 <u>idea</u>", "text": f"the lowest record {_MARKUP.format(6)} is the first test"},
]
QUESTION = "this is the lowest test question"


def build_tiny_open_qa(directory: Path):
    """A random tiny REALM model (seeded) over `HOSTILE_RECORDS` in a `DocumentStore`, as an "open-qa" pipeline."""
    torch.manual_seed(0)
    tokenizer = RealmTokenizer(str(write_vocab(directory / "vocab", RETRIEVAL_TEST_VOCAB)))
    store = DocumentStore.from_records(HOSTILE_RECORDS, cache_dir=directory / "store")
    config = tiny_config(vocab_size=len(RETRIEVAL_TEST_VOCAB), num_block_records=len(store), reader_beam_size=6,
                         searcher_beam_size=6, max_span_width=4)  # fmt: skip
    model = RealmForOpenQA(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
        model.block_emb.normal_()
    retriever = RealmRetriever(block_records=store.as_block_records(), tokenizer=tokenizer)
    return pipeline("open-qa", model=model.eval(), tokenizer=tokenizer, retriever=retriever, device="cpu")


@contextlib.contextmanager
def live_server(app, timeout: float = 30.0) -> Iterator[str]:
    """Runs `app` with uvicorn in a thread on 127.0.0.1, on a free port; yields its base URL."""
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test server did not start within {timeout} s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)
        listener.close()
