"""The BM25 baseline searcher (bm25s) over a list of texts or a DocumentStore."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

if importlib.util.find_spec("bm25s") is None:  # not imported here: realm_hf imports it without JAX
    pytest.skip("bm25s is not installed", allow_module_level=True)

from realm_hf.retrieval.bm25 import BM25Searcher  # noqa: E402

TEXTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "Mount Fuji is the highest mountain in Japan.",
    "Oxygen is a chemical element with atomic number 8.",
    "Indium is a chemical element; it has symbol In and atomic number 49.",
]


@pytest.fixture(scope="module")
def searcher():
    return BM25Searcher.from_documents(TEXTS)


def test_right_passage_ranks_first(searcher):
    result = searcher.search_text(
        ["What is the capital of France?", "highest mountain in Japan", "atomic number 8", "Which element is 49?"], k=3
    )
    assert result.ids[:, 0].tolist() == [0, 2, 3, 4]
    assert searcher.num_blocks == len(TEXTS)


def test_shapes_dtypes_and_order(searcher):
    scores, ids = searcher.search_text(["capital of Germany", "chemical element"], k=len(TEXTS))
    assert scores.shape == ids.shape == (2, len(TEXTS))
    assert scores.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.all(scores[:, :-1] >= scores[:, 1:])
    assert sorted(ids[0].tolist()) == list(range(len(TEXTS)))
    # Ties (here all blocks without a query word, at 0) come lowest id first.
    assert ids[0, :2].tolist() == [1, 0] and ids[0, 2:].tolist() == [2, 3, 4] and torch.all(scores[0, 2:] == 0)


def test_question_without_known_words(searcher):
    scores, ids = searcher.search_text(["zzz qqq", "the of"], k=2)
    assert ids.tolist() == [[0, 1], [0, 1]] and torch.all(scores == 0)


def test_deterministic():
    questions = ["capital city", "chemical element atomic number"]
    first = BM25Searcher.from_documents(TEXTS).search_text(questions, k=4)
    second = BM25Searcher.from_documents(TEXTS).search_text(questions, k=4)
    assert torch.equal(first.ids, second.ids) and torch.equal(first.scores, second.scores)


def test_errors(searcher):
    with pytest.raises(ValueError, match=r"between 1 and num_blocks=5, received 0"):
        searcher.search_text(["capital"], k=0)
    with pytest.raises(ValueError, match=r"between 1 and num_blocks=5, received 6"):
        searcher.search_text(["capital"], k=6)
    with pytest.raises(ValueError, match="at least one question"):
        searcher.search_text([], k=1)
    with pytest.raises(TypeError, match="wrap it in a list"):
        searcher.search_text("capital", k=1)
    with pytest.raises(ValueError, match="at least one document"):
        BM25Searcher.from_documents([])


def test_document_store_with_and_without_titles(tmp_path):
    from realm_hf.retrieval.document_store import DocumentStore

    store = DocumentStore.from_records(
        [{"title": "Kenya", "text": "Nairobi is the capital."}, {"title": "Peru", "text": "Lima is the capital."}],
        cache_dir=tmp_path,
    )
    with_titles = BM25Searcher.from_documents(store)
    assert with_titles.num_blocks == 2
    assert with_titles.search_text(["capital of Peru"], k=1).ids.tolist() == [[1]]
    without_titles = BM25Searcher.from_documents(store, include_title=False)
    # Without titles "Peru" is nowhere: both blocks score the same on "capital", lower id first.
    scores, ids = without_titles.search_text(["capital of Peru"], k=2)
    assert ids.tolist() == [[0, 1]] and scores[0, 0] == scores[0, 1] > 0


def test_an_index_over_a_store_is_kept_on_disk_and_loaded_back(tmp_path, monkeypatch):
    from realm_hf.retrieval.bm25 import _import_bm25s
    from realm_hf.retrieval.document_store import DocumentStore

    records = [{"title": f"T{index}", "text": text} for index, text in enumerate(TEXTS)]
    store = DocumentStore.from_records(records, cache_dir=tmp_path / "store")
    cache = tmp_path / "bm25"
    built = BM25Searcher.from_documents(store, cache_dir=cache)
    (entry,) = cache.iterdir()  # one entry, written whole (no temporary directory left)
    assert (entry / "settings.json").is_file()
    questions = ["capital of France", "atomic number 49", "highest mountain"]
    expected = built.search_text(questions, k=3)

    bm25s = _import_bm25s()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the index was rebuilt instead of loaded")

    with monkeypatch.context() as patched:
        patched.setattr(bm25s.BM25, "index", no_rebuild)
        loaded = BM25Searcher.from_documents(store, cache_dir=cache)
    assert loaded.num_blocks == len(TEXTS)
    result = loaded.search_text(questions, k=3)
    assert torch.equal(result.ids, expected.ids) and torch.allclose(result.scores, expected.scores)

    # Other settings (no titles) are another entry; a damaged entry is rebuilt, with a warning, and replaced.
    BM25Searcher.from_documents(store, include_title=False, cache_dir=cache)
    assert len(list(cache.iterdir())) == 2
    for array in entry.glob("*.npy"):
        array.write_bytes(b"not numpy")
    rebuilt = BM25Searcher.from_documents(store, cache_dir=cache)
    assert torch.equal(rebuilt.search_text(questions, k=3).ids, expected.ids)
    assert torch.equal(
        BM25Searcher.from_documents(store, cache_dir=cache).search_text(questions, k=3).ids, expected.ids
    )
    # A list of texts has no fingerprint: nothing is kept.
    BM25Searcher.from_documents(TEXTS, cache_dir=tmp_path / "unused")
    assert not (tmp_path / "unused").exists()


FAKE_JAX = """
from pathlib import Path
Path(__file__).with_name("imported").write_text("yes")
"""


def test_building_an_index_leaves_jax_alone(tmp_path):
    """bm25s starts JAX at import where JAX is installed (75% of a GPU's memory per process); realm_hf hides it."""
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_JAX)
    (fake / "lax.py").write_text("def top_k(operand, k):\n    raise AssertionError('JAX ran')\n")
    program = (
        "import sys; from realm_hf.retrieval.bm25 import BM25Searcher\n"
        f"result = BM25Searcher.from_documents({TEXTS!r}).search_text(['capital of Germany'], k=1)\n"
        "assert result.ids[0, 0] == 1 and 'jax' not in sys.modules\n"
        "import jax; print(jax.__file__)\n"  # still importable afterwards by the program itself
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == str(fake / "__init__.py")
    assert (fake / "imported").read_text() == "yes"  # imported once, by the program, after the index was built
