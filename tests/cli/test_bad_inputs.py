"""A catalogue of bad inputs, across the command line and the API (issue 16): every one a clean failure.

On the command line: the exit code (2 usage, 1 runtime), a last stderr line `realm-hf COMMAND: error: ...` naming the
cause, no traceback, no input file modified and no index that looks complete (an `index.json`) where there was none.
The commands run in-process (`main(argv)`); test_cli_processes.py runs the few that need a real process.
"""

import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from realm_hf import RealmEmbedder, RealmForOpenQA, RealmRetriever
from realm_hf.cli.main import main
from realm_hf.demo import ensure_demo_model
from realm_hf.errors import FileFormatError, IndexMismatchError, InputError, MissingFileError, RealmHfError
from realm_hf.retrieval.document_store import DocumentStore
from realm_hf.retrieval.index_builder import write_index
from realm_hf.retrieval.index_files import read_manifest
from realm_hf.retrieval.torch_search import ExactSearcher

GOOD = "".join(
    json.dumps({"title": f"Doc {i}", "text": f"Paris is the capital of France {i}."}) + "\n" for i in range(6)
)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, demo_dir):
    """The user's files, made once; the test checks that none of them changes."""
    root = tmp_path_factory.mktemp("inputs")
    files = {
        "good.jsonl": GOOD.encode(),
        "empty.jsonl": b"",
        "blank.jsonl": b"\n  \n",
        "notext.jsonl": b'{"title": "a", "body": "b"}\n',
        "broken.jsonl": b'{"text": "a"}\n{"text": "b",\n',
        "list.jsonl": b'{"text": "a"}\n["text"]\n',
        "latin1.jsonl": b'{"text": "a"}\n{"text": "caf\xe9"}\n',
        "wrong.csv": b"foo,bar\n1,2\n",
        "wrong.tsv": b"foo\tbar\n1\t2\n",
        "empty.csv": b"",
        "broken.parquet": b"PAR1 not really parquet",
        "notes.docx": b"PK not really a document",
        "notes": b"Paris is the capital of France.\n",
        "empty-rows.jsonl": b'{"text": ""}\n\n{"text": "  ", "title": ""}\n',
        "caps.csv": b"Title,Text\nA,a\n",
        "semi.csv": b"title;text\nA;a\n",
        "array.json": b'[{"text": "a"}, {"title": "b"}]',
        "holes.jsonl": b'{"text": "a"}\n\n{"title": "b"}\n',
        "number.jsonl": b'{"text": "a"}\n{"text": 12345}\n',
        "undecodable.txt": b"Paris is the capital.\n\nCaf\x81 au lait.\n",  # neither UTF-8 nor Windows-1252
        "blank.md": b"# Only a heading\n\n   \n",
        "mixed/notes.md": b"# Notes\n\nParis is the capital of France.\n",
        "mixed/rows.jsonl": GOOD.encode(),
        "office/letter.pdf": b"%PDF-1.4 not text\n",
        "office/plan.docx": b"PK\x03\x04 not text",
        "qa-broken.jsonl": b'{"question": "q?", "answers": ["a"]}\n{"question": "r?",\n',
        "qa-squad.jsonl": b'{"question": "q?", "answers": {"text": ["a"], "answer_start": [0]}}\n',
        "qa-blank-question.jsonl": b'{"question": "q?", "answers": ["a"]}\n\n{"question": " ", "answers": ["b"]}\n',
        "qa-null-question.jsonl": b'{"question": "q?", "answers": ["a"]}\n{"question": null, "answers": ["b"]}\n',
        "qa-latin1.jsonl": b'{"question": "q?", "answers": ["a"]}\n{"question": "caf\xe9?", "answers": ["b"]}\n',
        "qa-decimal.jsonl": b'{"question": "q?", "answers": [1.5]}\n',
        "qa-array.json": b'[{"question": "q?", "answers": ["a"]}]',
        "qa-unanswerable.jsonl": b'{"question": "q?", "answers": []}\n{"question": "r?", "answers": []}\n',
    }
    for name, data in files.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(data)
    # A finished index over good.jsonl, and copies of it damaged in one part each.
    finished = root / "finished"
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(root / "good.jsonl"), "--output",
                 str(finished), "--quiet"]) == 0  # fmt: skip
    broken_manifest = root / "broken-manifest"
    _copy_tree(finished, broken_manifest)
    (broken_manifest / "index.json").write_text('{"format": "realm_hf.index", "dim": 32,, }')
    fewer_documents = root / "fewer-documents"
    _copy_tree(finished, fewer_documents)
    DocumentStore.from_records([{"text": "only one", "title": ""}]).save(
        fewer_documents / "documents",
    )
    missing_shard = root / "missing-shard"
    _copy_tree(finished, missing_shard)
    (missing_shard / "embeddings-00000.safetensors").unlink()
    missing_documents = root / "missing-documents"
    _copy_tree(finished, missing_documents)
    shutil.rmtree(missing_documents / "documents")
    # What the first build over an empty JSONL used to leave: documents/ with no documents, no index.json.
    leftover = root / "leftover"
    DocumentStore.from_records([]).save(leftover / "documents")
    return root


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target)


def _hashes(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}  # fmt: skip


def _complete_indexes(root: Path) -> set[str]:
    return {str(path.parent.relative_to(root)) for path in root.rglob("index.json")}


# (id, argv with {in} = the inputs folder, {demo} = the demo model and {out} = a fresh output folder, stdin bytes or
# None, expected exit code, text the last stderr line must hold)
CLI_CASES = [
    ("unknown-command", ["frobnicate"], None, 2, "invalid choice: 'frobnicate'"),
    ("misspelt-command", ["aks", "q?"], None, 2, "invalid choice: 'aks' (choose from 'demo', 'ask', 'index', "
     "'convert', 'evaluate', 'push', 'train', 'calibrate', 'pretrain', 'serve'); did you mean 'ask'? (see `realm-hf "
     "--help`)"),
    ("misspelt-index-subcommand", ["index", "biuld", "--corpus", "x"], None, 2, "invalid choice: 'biuld' (choose "
     "from 'build', 'add', 'offload', 'compress', 'eval'); did you mean 'build'? (see `realm-hf index --help`)"),
    ("ask-index-shard-missing", ["ask", "--model", "{demo}", "--index", "{in}/missing-shard", "q?"], None, 1,
     "missing-shard' is damaged: index shard "),
    ("ask-index-documents-missing", ["ask", "--model", "{demo}", "--index", "{in}/missing-documents", "q?"], None, 1,
     "missing-documents/documents is missing: the texts of the index's 6 blocks, built from "),
    ("ask-index-manifest-broken", ["ask", "--model", "{demo}", "--index", "{in}/broken-manifest", "q?"], None, 1,
     "broken-manifest' is damaged: "),
    ("evaluate-index-shard-missing", ["evaluate", "--model", "{demo}", "--index", "{in}/missing-shard", "--data",
                                      "{in}/qa-broken.jsonl"], None, 1, "missing-shard' is damaged: index shard "),
    ("train-index-documents-missing", ["train", "--model", "{demo}", "--index", "{in}/missing-documents",
                                       "--train-file", "{in}/qa-broken.jsonl", "--output-dir", "{out}"], None, 1,
     "missing-documents' is damaged: "),
    ("top-k-zero", ["ask", "--model", "{demo}", "--top-k", "0", "q?"], None, 2, "expected a positive integer, got '0'"),
    ("batch-size-word", ["ask", "--batch-size", "many", "q?"], None, 2, "expected a positive integer, got 'many'"),
    ("build-missing-args", ["index", "build", "--model", "{demo}"], None, 2, "required: --corpus, --output"),
    ("build-shard-size-zero", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                               "{out}", "--shard-size", "0"], None, 2, "expected a positive integer, got '0'"),
    ("ask-no-such-model", ["ask", "--model", "{in}/no/such/dir", "q?"], None, 1, "no/such/dir': no such directory"),
    ("ask-repo-id-not-cached", ["ask", "--model", "no-such-model", "q?"], None, 1,
     "--model 'no-such-model' is neither a directory here"),
    ("build-repo-id-not-cached", ["index", "build", "--model", "nobody/no-such-model", "--corpus", "{in}/good.jsonl",
                                  "--output", "{out}"], None, 1, "nor a Hub repo in the Hub cache (offline"),
    ("ask-model-without-config", ["ask", "--model", "{in}/leftover", "q?"], None, 1,
     "holds no config.json: expected a model directory"),
    ("ask-index-as-model", ["ask", "--model", "{in}/finished", "q?"], None, 1,
     "is an index, not a model: pass it as --index"),
    ("ask-index-is-a-corpus", ["ask", "--model", "{demo}", "--index", "{in}/good.jsonl", "q?"], None, 1,
     "good.jsonl' is a file; expected an index directory. If it holds your documents, build an index from it first"),
    ("ask-index-is-its-manifest", ["ask", "--model", "{demo}", "--index", "{in}/finished/index.json", "q?"], None, 1,
     "index.json' is a file; expected the index directory (`realm-hf index build --output`), here"),
    ("ask-index-unfinished", ["ask", "--model", "{demo}", "--index", "{in}/leftover", "q?"], None, 1,
     "is an unfinished `realm-hf index build`"),
    ("ask-only-punctuation", ["ask", "--model", "{demo}", "?"], None, 1,
     "expected a question in words, received only punctuation or symbols: '?'"),
    ("ask-stdin-empty", ["ask", "--model", "{demo}"], b"", 2, "received nothing (empty input)"),
    ("build-misspelt-required-option", ["index", "build", "--corpus", "{in}/good.jsonl", "--ouput", "{out}"], None, 2,
     "the following arguments are required: --output (--ouput: did you mean --output?)"),
    ("ask-misspelt-option", ["ask", "--topk", "3", "q?"], None, 2, "unrecognized arguments: --topk; did you mean "
                                                                   "--top-k? (see `realm-hf ask --help`)"),
    ("build-output-is-a-file", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                                "{in}/good.jsonl"], None, 2, "good.jsonl' is a file; expected a directory to write the "
                                                             "index into (a new one, or an unfinished build to resume)"),
    ("train-index-missing", ["train", "--model", "{demo}", "--index", "{in}/no-index", "--train-file",
                             "{in}/qa-broken.jsonl", "--output-dir", "{out}"], None, 1,
     "no-index': no such directory (expected an index directory"),
    ("train-file-is-a-directory", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file", "{in}",
                                   "--output-dir", "{out}"], None, 1, "is a directory; expected a .jsonl, .json"),
    ("train-answers-squad-layout", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                                    "{in}/qa-squad.jsonl", "--output-dir", "{out}"], None, 1,
     "qa-squad.jsonl line 1: expected 'answers' to be a list of strings (or one string), received a dict with keys "
     "['answer_start', 'text'] (SQuAD's layout: give the answer texts themselves"),
    ("train-blank-question", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                              "{in}/qa-blank-question.jsonl", "--output-dir", "{out}"], None, 1,
     "qa-blank-question.jsonl line 3: expected a non-empty 'question' string, received ' '"),
    ("train-null-question", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                             "{in}/qa-null-question.jsonl", "--output-dir", "{out}"], None, 1,
     "qa-null-question.jsonl line 2: expected a non-empty 'question' string, received None"),
    ("train-decimal-answer", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                              "{in}/qa-decimal.jsonl", "--output-dir", "{out}"], None, 1,
     "qa-decimal.jsonl line 1: expected 'answers' to be a list of strings (or one string), received [1.5]: write a "
     "number as the documents spell it"),
    ("train-latin1", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file", "{in}/qa-latin1.jsonl",
                      "--output-dir", "{out}"], None, 1,
     "qa-latin1.jsonl line 2: expected UTF-8 text, received byte 0xe9 at byte offset 54 (save the file as UTF-8)"),
    ("train-output-is-the-index", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                                   "{in}/qa-squad.jsonl", "--output-dir", "{in}/finished"], None, 2,
     "finished is the index you train over (--index) (it holds index.json): training would write the model's files "
     "among the index's; expected another directory"),
    ("train-output-is-a-file", ["train", "--model", "{demo}", "--index", "{in}/finished", "--train-file",
                                "{in}/qa-squad.jsonl", "--output-dir", "{in}/good.jsonl"], None, 2,
     "good.jsonl' is a file; expected a directory to write the checkpoints and the trained model in (a new one, e.g. "
     "--output-dir my-model)"),
    ("eval-answers-squad-layout", ["evaluate", "--model", "{demo}", "--data", "{in}/qa-squad.jsonl"], None, 1,
     "line 1: expected 'answers' to be a list of strings (or one string), received a dict with keys"),
    ("eval-blank-question", ["evaluate", "--model", "{demo}", "--data", "{in}/qa-blank-question.jsonl"], None, 1,
     "qa-blank-question.jsonl': line 3: expected a non-empty 'question' string, received ' '"),
    ("eval-latin1", ["evaluate", "--model", "{demo}", "--data", "{in}/qa-latin1.jsonl"], None, 1,
     "qa-latin1.jsonl': line 2: expected UTF-8 text, received byte 0xe9 at byte offset 54"),
    ("eval-empty", ["evaluate", "--model", "{demo}", "--data", "{in}/empty.jsonl"], None, 1,
     "empty.jsonl is empty: expected one question per line, e.g. {\"question\": \"Who founded Acme?\""),
    ("eval-json-array", ["evaluate", "--model", "{demo}", "--data", "{in}/qa-array.json"], None, 1,
     "line 1: expected a 'question' string and 'answers' (or 'answer'), got a JSON array; write one JSON object per "
     "line (JSON Lines)"),
    ("eval-missing-data", ["evaluate", "--model", "{demo}", "--data", "{in}/missing.jsonl"], None, 1,
     "missing.jsonl': no such file or directory (expected a JSON Lines file of"),
    ("calibrate-only-unanswerable", ["calibrate", "--model", "{demo}", "--data", "{in}/qa-unanswerable.jsonl"], None,
     1, "qa-unanswerable.jsonl: all 2 questions have \"answers\": [] (unanswerable); expected questions with answers "
        "among them too"),
    ("compress-bad-factory", ["index", "compress", "--model", "{demo}", "--output", "{out}", "--factory", "BOGUS"],
     None, 1, "factory 'BOGUS': faiss cannot make an index of it for 32-d vectors (could not parse index string"),
    ("push-bad-repo-id", ["push", "{demo}", "bad repo!!"], None, 2,
     "REPO_ID 'bad repo!!': expected 'name' or 'namespace/name'"),
    ("push-an-index", ["push", "{in}/finished", "me/x"], None, 1, "is an index, not a model: push the model directory"),
    ("push-missing-index", ["push", "{demo}", "me/x", "--index", "{in}/no-index"], None, 1,
     "no-index': no such directory (expected an index directory"),
    ("convert-config-not-json", ["convert", "tf", "--checkpoint", "{in}/no-checkpoint", "--config", "{in}/good.jsonl",
                                "--output", "{out}"], None, 1, "good.jsonl: expected a REALM config.json (one JSON"),
    ("offload-over-an-index", ["index", "offload", "--model", "{demo}", "--output", "{in}/finished"], None, 2,
     "finished already holds files (documents, embeddings-00000.safetensors, index.json): expected a new or empty"),
    ("compress-over-an-index", ["index", "compress", "--model", "{demo}", "--output", "{in}/finished"], None, 2,
     "finished already holds files"),
    ("convert-over-a-model", ["convert", "tf", "--checkpoint", "{in}/no-checkpoint", "--output", "{demo}"], None, 2,
     "already holds files"),
    ("add-to-a-missing-index", ["index", "add", "--index", "{in}/no-index", "--model", "{demo}", "--corpus",
                                "{in}/good.jsonl"], None, 1, "no-index': no such directory (expected an index"),
    ("eval-jsonl-broken-line", ["evaluate", "--model", "{demo}", "--data", "{in}/qa-broken.jsonl"], None, 1,
     "line 2: expected JSON Lines (one JSON object per line)"),
    ("eval-csv", ["evaluate", "--model", "{demo}", "--data", "{in}/wrong.csv"], None, 1,
     "expected a JSON Lines file of {\"question\": ..., \"answers\": [...]} rows, one per line; got a .csv file"),
    ("ask-model-is-a-file", ["ask", "--model", "{in}/notes.docx", "q?"], None, 1, "is a file; expected a model"),
    ("ask-no-such-index", ["ask", "--model", "{demo}", "--index", "{in}/no-index", "q?"], None, 1,
     "no-index': no such directory (expected an index directory written by `realm-hf index build`"),
    ("ask-index-without-manifest", ["ask", "--model", "{demo}", "--index", "{in}/leftover/documents", "q?"], None, 1,
     "expects an index directory holding index.json (as `realm-hf index build` writes it);"),
    ("ask-index-is-the-documents", ["ask", "--model", "{demo}", "--index", "{in}", "q?"], None, 1,
     "holds documents (blank.jsonl, blank.md, broken.jsonl, ...), not an index; expected an index directory holding "
     "index.json. Build one over them first: realm-hf index build --corpus "),
    ("build-corpus-misspelt", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonk", "--output",
                               "{out}"], None, 1, "does not exist (expected a file of rows, a text or Markdown file, a "
                                                  "folder of them, or a saved document store); did you mean "),
    ("ask-stdin-json-rows-without-question", ["ask", "--model", "{demo}"], b'{"q": "Who?", "a": "x"}\n', 2,
     'standard input line 1: expected a question, or a JSON row with a "question" (as question files have), received '
     "a JSON object with keys ['a', 'q'] (to score answers against a file of questions and answers: realm-hf "
     "evaluate --data FILE)"),
    ("ask-negative-bm25-weight", ["ask", "--model", "{demo}", "--bm25-weight", "-1", "q?"], None, 2,
     "expected a number >= 0, got '-1'"),
    ("ask-device-word", ["ask", "--model", "{demo}", "--device", "gpu", "q?"], None, 2,
     "expected auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("build-device-word", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output", "{out}",
                           "--device", "tpu"], None, 2, "expected auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("ask-empty", ["ask", "--model", "{demo}", ""], None, 2, "expected a question, received only blank ones"),
    ("ask-blank", ["ask", "--model", "{demo}", "   "], None, 2, "expected a question, received only blank ones"),
    ("demo-empty", ["demo", "--untrained", "--output", "{out}", ""], None, 2,
     "expected a question, received only blank ones: ['']"),
    ("demo-blank", ["demo", "--untrained", "--output", "{out}", "   ", ""], None, 2,
     "expected a question, received only blank ones: ['   ', '']"),
    ("ask-one-empty-of-two", ["ask", "--model", "{demo}", "Where is Paris?", ""], None, 1,
     "1 of 2 questions could not be asked (first: expected a question, received an empty string)"),
    ("ask-lone-surrogate", ["ask", "--model", "{demo}", "caf\udce9?"], None, 1, "lone surrogate '\\udce9'"),
    ("ask-stdin-blank", ["ask", "--model", "{demo}"], b"\n   \n\n", 2, "received only blank lines"),
    ("ask-stdin-latin1", ["ask", "--model", "{demo}"], b"who?\ncaf\xe9?\n", 1,
     "expected UTF-8 text, received byte 0xe9 at byte offset 8"),
    ("build-empty-jsonl", ["index", "build", "--model", "{demo}", "--corpus", "{in}/empty.jsonl", "--output", "{out}"],
     None, 1, "expected at least one document"),
    ("build-blank-jsonl", ["index", "build", "--model", "{demo}", "--corpus", "{in}/blank.jsonl", "--output", "{out}"],
     None, 1, "expected at least one document"),
    ("build-jsonl-without-text", ["index", "build", "--model", "{demo}", "--corpus", "{in}/notext.jsonl", "--output",
                                  "{out}"], None, 1, "expected a text column 'text', found columns ['title', 'body']; "
                                                     "pass --text-column with the column that holds the text"),
    ("build-only-empty-rows", ["index", "build", "--model", "{demo}", "--corpus", "{in}/empty-rows.jsonl", "--output",
                               "{out}"], None, 1, "empty-rows.jsonl': expected rows with a text or a title, received 2 "
                                                  "rows with neither (lines 1, 3)"),
    ("build-broken-json-line", ["index", "build", "--model", "{demo}", "--corpus", "{in}/broken.jsonl", "--output",
                                "{out}"], None, 1, "broken.jsonl line 2: expected JSON Lines"),
    ("build-json-list-line", ["index", "build", "--model", "{demo}", "--corpus", "{in}/list.jsonl", "--output",
                              "{out}"], None, 1, "list.jsonl line 2: expected JSON Lines (one JSON object per line)"),
    ("build-latin1-jsonl", ["index", "build", "--model", "{demo}", "--corpus", "{in}/latin1.jsonl", "--output",
                            "{out}"], None, 1, "latin1.jsonl line 2: expected UTF-8 text, received byte 0xe9"),
    ("build-csv-wrong-columns", ["index", "build", "--model", "{demo}", "--corpus", "{in}/wrong.csv", "--output",
                                 "{out}"], None, 1, "wrong.csv: expected a text column 'text', found columns ['foo', "
                                                    "'bar']; pass --text-column with the column that holds the text, "
                                                    "or several that together say what a row is (--text-column "
                                                    "name,role,phone writes each row as \"name: ...; role: ...; "
                                                    "phone: ...\"), and --title-column with the one of the titles, "
                                                    "if any"),
    ("build-tsv-wrong-columns", ["index", "build", "--model", "{demo}", "--corpus", "{in}/wrong.tsv", "--output",
                                 "{out}"], None, 1, "expected a text column 'text', found columns ['foo', 'bar']"),
    ("build-empty-csv", ["index", "build", "--model", "{demo}", "--corpus", "{in}/empty.csv", "--output", "{out}"],
     None, 1, "empty.csv could not be read as csv"),
    ("build-broken-parquet", ["index", "build", "--model", "{demo}", "--corpus", "{in}/broken.parquet", "--output",
                              "{out}"], None, 1, "broken.parquet could not be read as parquet"),
    ("build-unknown-suffix", ["index", "build", "--model", "{demo}", "--corpus", "{in}/notes.docx", "--output",
                              "{out}"], None, 1, "notes.docx': expected a file ending in one of ['.csv', '.json', "
                                                 "'.jsonl', '.ndjson', '.parquet', '.pq', '.tsv'] (rows; optionally "
                                                 "compressed), ['.txt', '.text', '.md', '.markdown'] (text) or "
                                                 "['.npy', '.safetensors'] (block records), a directory of text files "
                                                 "or a saved document store; received a .docx file (Word files are "
                                                 "not read: save them as plain text, .txt, or Markdown to index "
                                                 "them)"),
    ("build-no-suffix", ["index", "build", "--model", "{demo}", "--corpus", "{in}/notes", "--output", "{out}"], None,
     1, "received a file without an ending. If it holds one of those, rename it to that ending"),
    ("build-row-without-text", ["index", "build", "--model", "{demo}", "--corpus", "{in}/holes.jsonl", "--output",
                                "{out}"], None, 1, "holes.jsonl: line 3 has no text; expected a 'text' field"),
    ("build-number-as-text", ["index", "build", "--model", "{demo}", "--corpus", "{in}/number.jsonl", "--output",
                              "{out}"], None, 1, "number.jsonl: line 2 field 'text': expected str, received int"),
    ("build-csv-capitalised-columns", ["index", "build", "--model", "{demo}", "--corpus", "{in}/caps.csv", "--output",
                                       "{out}"], None, 1, "rename 'Text' to 'text', or pass --text-column Text)"),
    ("build-csv-semicolons", ["index", "build", "--model", "{demo}", "--corpus", "{in}/semi.csv", "--output", "{out}"],
     None, 1, "found columns ['title;text'] (the file seems separated by ';' or '|'"),
    ("build-json-array-item", ["index", "build", "--model", "{demo}", "--corpus", "{in}/array.json", "--output",
                               "{out}"], None, 1, "array.json: array item 1 has no text"),
    ("build-undecodable-text", ["index", "build", "--model", "{demo}", "--corpus", "{in}/undecodable.txt", "--output",
                                "{out}"], None, 1,
     "undecodable.txt line 3: expected UTF-8 text, received byte 0x81 at byte offset 26 (save the file as UTF-8)"),
    ("build-text-without-text", ["index", "build", "--model", "{demo}", "--corpus", "{in}/blank.md", "--output",
                                 "{out}"], None, 1, "blank.md': expected text, found only blank lines"),
    ("build-directory-of-rows", ["index", "build", "--model", "{demo}", "--corpus", "{in}/mixed", "--output",
                                 "{out}"], None, 1, "mixed': a folder is read as text files (.txt/.text/.md/.markdown), "
                                                    "and this one also holds files of rows (rows.jsonl). Pass files of "
                                                    "rows one at a time"),
    ("build-directory-of-documents-not-read", ["index", "build", "--model", "{demo}", "--corpus", "{in}/office",
                                               "--output", "{out}"], None, 1,
     "office': expected a directory of text files (.txt/.text/.md/.markdown), a file of rows (.csv/.json/.jsonl/"
     ".ndjson/.parquet/.pq/.tsv) or a saved document store; found letter.pdf, plan.docx there (PDF and Word files are "
     "not read: save them as plain text, .txt, or Markdown to index them)"),
    ("build-negative-max-words", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                                  "{out}", "--max-words", "-1"], None, 2, "--max-words"),
    ("build-missing-corpus", ["index", "build", "--model", "{demo}", "--corpus", "{in}/missing.jsonl", "--output",
                              "{out}"], None, 1, "missing.jsonl' does not exist"),
    ("build-no-such-model", ["index", "build", "--model", "./no-such-model", "--corpus", "{in}/good.jsonl",
                             "--output", "{out}"], None, 1, "'./no-such-model': no such directory"),
    ("build-into-finished-index", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                                   "{in}/finished"], None, 2, "finished already holds a finished index: pass --overwrite "
                                                              "to replace it (the old one stays until the new one is "
                                                              "complete), add documents to it with `realm-hf index "
                                                              "add --index"),
    ("build-overwrite-what-is-no-index", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl",
                                          "--output", "{in}/mixed", "--overwrite"], None, 2,
     "mixed holds files that are no part of an index (notes.md, rows.jsonl); expected a directory of nothing but an "
     "index to replace"),
    ("build-output-under-a-file", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                                   "{in}/good.jsonl/index"], None, 2,
     "/good.jsonl, which is a file; expected a directory to write the index into"),
    ("build-over-empty-leftover", ["index", "build", "--model", "{demo}", "--corpus", "{in}/good.jsonl", "--output",
                                   "{in}/leftover"], None, 1, "holds a partial build over another corpus (0 documents"),
    ("add-to-a-non-index", ["index", "add", "--index", "{in}/leftover", "--model", "{demo}", "--corpus",
                            "{in}/good.jsonl"], None, 1, "is not a realm_hf index: index.json is missing"),
    ("add-broken-manifest", ["index", "add", "--index", "{in}/broken-manifest", "--model", "{demo}", "--corpus",
                             "{in}/good.jsonl"], None, 1, "broken-manifest/index.json is not valid JSON"),
    ("add-documents-disagree", ["index", "add", "--index", "{in}/fewer-documents", "--model", "{demo}", "--corpus",
                                "{in}/good.jsonl"], None, 1, "inconsistent: 1 documents but 6 embedded blocks"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "stdin", "code", "message"), [case[1:] for case in CLI_CASES],
                         ids=[case[0] for case in CLI_CASES])  # fmt: skip
def test_cli_bad_input_is_one_clean_line(argv, stdin, code, message, inputs, demo_dir, tmp_path, capsys, monkeypatch):
    output = tmp_path / "out"
    argv = [arg.format(**{"in": inputs, "demo": demo_dir, "out": output}) for arg in argv]
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    before, complete_before = _hashes(inputs), _complete_indexes(inputs)
    try:
        returned = main(argv)
    except SystemExit as exit_info:  # argparse's usage errors
        returned = exit_info.code
    err = capsys.readouterr().err
    assert returned == code, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("realm-hf") and "error: " in last, err[-2000:]
    assert message in last, last
    assert "Traceback" not in err
    assert _hashes(inputs) == before  # nothing the user gave was modified
    assert _complete_indexes(inputs) == complete_before
    assert not output.exists() or not (output / "index.json").exists()


@pytest.mark.parametrize(("damaged", "part"), [
    ("missing-shard", "missing-shard/embeddings-00000.safetensors is missing"),
    ("broken-manifest", "broken-manifest/index.json is not valid JSON"),
    # not "holds 6 blocks but the documents at .../demo hold 16": the model's own corpus does not stand in
    ("missing-documents", "missing-documents/documents is missing: the texts of the index's 6 blocks"),
])  # fmt: skip
def test_a_damaged_index_is_named_not_the_model(damaged, part, inputs, demo_dir, capsys):
    assert main(["ask", "--model", str(demo_dir), "--index", str(inputs / damaged), "q?"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"realm-hf ask: error: --index {str(inputs / damaged)!r} is damaged: ") and part in err
    assert err.endswith("that `realm-hf index build` writes (build it again, with --overwrite)")
    assert "could not load" not in err and "--model" not in err and len(err.splitlines()) == 1


def test_api_an_index_without_its_documents_is_refused(inputs, demo_dir):
    from realm_hf import load_open_qa

    with pytest.raises(FileFormatError, match=r"missing-documents/documents is missing: the texts of the index's 6"):
        load_open_qa(demo_dir, index=inputs / "missing-documents")


@pytest.mark.parametrize(
    ("corpus", "advice"),
    [("notes.docx", "(Word files are not read: save them as plain text, .txt, or Markdown to index them)"),
     ("notes", ". If it holds one of those, rename it to that ending")],
)  # fmt: skip
def test_an_unknown_corpus_ending_lists_what_the_command_line_reads(corpus, advice, inputs, demo_dir, tmp_path,
                                                                    capsys):  # fmt: skip
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(inputs / corpus), "--output",
                 str(tmp_path / "out")]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "'.txt'" in err and "'.md'" in err and "'.jsonl'" in err and "file_format" not in err
    assert err.endswith(advice)  # a Word file renamed .txt would be read as its bytes: it is converted, not renamed


def test_a_folder_names_the_files_it_skips_and_those_with_no_text(demo_dir, tmp_path, capsys):
    folder = tmp_path / "mine"
    (folder / "letters").mkdir(parents=True)
    (folder / "handbook.md").write_text("# Leave\n\nYour manager approves your leave.\n", encoding="utf-8")
    (folder / "empty.txt").write_text("\n\n", encoding="utf-8")
    (folder / "letters" / "offer.pdf").write_bytes(b"%PDF-1.4")
    (folder / "notes").write_text("no ending", encoding="utf-8")
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(folder), "--output",
                 str(tmp_path / "index"), "--quiet"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert ("note: skipped 2 files that are not text or Markdown: letters/offer.pdf, notes (PDF files are not read: "
            "save them as plain text, .txt, or Markdown to index them)") in err  # fmt: skip
    assert "note: left out 1 file with no text: empty.txt" in err
    assert json.loads((tmp_path / "index" / "index.json").read_text())["num_blocks"] == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")
def test_an_output_that_cannot_be_made_is_named_before_the_corpus_is_read(inputs, demo_dir, capsys):
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(inputs / "good.jsonl"), "--output",
                 "/proc/realm-hf-index"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip() == (
        "realm-hf index build: error: --output '/proc/realm-hf-index': expected a directory to write the index into "
        "(a new one, or an unfinished build to resume), but its parent /proc takes no new files (No such file or "
        "directory)"
    )


@pytest.mark.parametrize("questions", [[""], ["   "], ["", " \t "]], ids=["empty", "blank", "two-blank"])
def test_demo_refuses_only_blank_questions_as_ask_does(questions, demo_dir, capsys, monkeypatch):
    """`demo ""` is a usage error, in `ask ""`'s words and exit code, before any model is built or loaded (with the
    default model or the untrained demo model alike)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built or loaded for blank questions")

    monkeypatch.setattr("realm_hf.cli.main._load", refuse)
    monkeypatch.setattr("realm_hf.cli.main._ensure_demo_model", refuse)
    assert main(["ask", "--model", str(demo_dir), *questions]) == 2
    ask_error = capsys.readouterr().err.strip()
    assert ask_error.startswith("realm-hf ask: error: expected a question, received only blank ones: "), ask_error
    for demo in (["demo"], ["demo", "--untrained"]):
        assert main([*demo, *questions]) == 2
        captured = capsys.readouterr()
        assert captured.err.strip() == ask_error.replace("realm-hf ask:", "realm-hf demo:", 1)
        assert captured.out == ""


def test_ask_answers_the_good_questions_of_a_batch_and_flags_the_bad(demo_dir, capsys):
    assert main(["ask", "--model", str(demo_dir), "--json", "Where is Paris?", "  ", "Who wrote Hamlet?"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["question"] for line in lines] == ["Where is Paris?", "  ", "Who wrote Hamlet?"]
    assert lines[1] == {"question": "  ", "error": "expected a question, received only whitespace '  '"}
    assert "error" not in lines[0] and "error" not in lines[2] and lines[0]["answer"] and lines[2]["answer"]


def test_top_k_beyond_the_candidate_spans_is_capped_with_a_warning(demo_dir, capsys, caplog):
    assert main(["ask", "--model", str(demo_dir), "--json", "--top-k", "100000", "Where is Paris?"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "top_k=100000 exceeds the" in caplog.text and "candidate spans of the blocks read" in caplog.text
    assert 1 < len(answers) < 100000


def test_a_rerun_after_a_failed_build_succeeds_and_agrees(inputs, demo_dir, tmp_path, capsys):
    """The sequence of the report: a failed build (empty corpus) leaves nothing; the rerun with a good corpus gives
    an index whose documents and embeddings agree."""
    output = tmp_path / "index"
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(inputs / "empty.jsonl"), "--output",
                 str(output)]) == 1  # fmt: skip
    assert not output.exists()
    assert main(["index", "build", "--model", str(demo_dir), "--corpus", str(inputs / "good.jsonl"), "--output",
                 str(output), "--quiet"]) == 0  # fmt: skip
    assert "indexed 6 blocks" in capsys.readouterr().out
    assert len(DocumentStore.load(output / "documents")) == read_manifest(output)["num_blocks"] == 6


# --- the API: the same causes raise the project's exceptions (ValueError / OSError subclasses) ----------------------


def test_api_ids_beyond_the_vocabulary():
    with pytest.raises(ValueError, match="token id 150, outside this model's vocabulary of 99 ids"):
        RealmEmbedder(tiny_config()).eval()(torch.tensor([[1, 150, 2]]))


def test_api_question_longer_than_the_position_embeddings():
    with pytest.raises(ValueError, match="70 tokens per sequence, more than this model's 64 position embeddings"):
        RealmEmbedder(tiny_config()).eval()(torch.ones(1, 70, dtype=torch.long))


def test_api_pipeline_truncates_an_over_long_question_with_a_warning(demo_dir, caplog):
    from transformers import pipeline

    open_qa = pipeline("open-qa", model=str(demo_dir), device="cpu")
    answer = open_qa("where is paris " * 200)
    assert answer["evidence"] and "question of 602 tokens truncated to 64" in caplog.text
    assert "Token indices sequence length" not in caplog.text


def test_api_lone_surrogate_in_a_question(demo_dir):
    from transformers import pipeline

    open_qa = pipeline("open-qa", model=str(demo_dir), device="cpu")
    with pytest.raises(InputError, match="lone surrogate") as error_info:
        open_qa("caf\udce9?")
    assert isinstance(error_info.value, ValueError)


def test_api_index_of_another_dimension_names_both(demo_dir, tmp_path):
    write_index(torch.randn(16, 16), tmp_path / "index16")
    retriever = RealmRetriever.from_pretrained(demo_dir)
    model = RealmForOpenQA.from_pretrained(demo_dir, retriever=retriever,
                                           searcher=ExactSearcher.from_index(tmp_path / "index16")).eval()  # fmt: skip
    inputs = retriever.tokenizer(["where is paris?"], return_tensors="pt")
    with pytest.raises(
        ValueError, match="the index holds 16-d block embeddings but this model embeds questions in 32-d"
    ):
        model(**inputs)


def test_api_readers_raise_named_errors(inputs, tmp_path):
    with pytest.raises(FileFormatError, match="broken.jsonl line 2") as error_info:
        DocumentStore.from_file(inputs / "broken.jsonl")
    assert error_info.value.location == "line 2" and isinstance(error_info.value, ValueError)
    with pytest.raises(FileFormatError, match="index.json is not valid JSON"):
        read_manifest(inputs / "broken-manifest")
    with pytest.raises(MissingFileError, match="index.json is missing") as missing:
        read_manifest(inputs / "leftover")
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(IndexMismatchError, match="inconsistent: 1 documents in .* but 6 embedded blocks"):
        from realm_hf.retrieval.index_builder import verify_index

        verify_index(inputs / "fewer-documents")
    assert issubclass(IndexMismatchError, RealmHfError)


def test_api_load_open_qa_names_what_is_not_a_model(inputs, tmp_path):
    from realm_hf.errors import ModelLoadError
    from realm_hf.loading import load_open_qa

    with pytest.raises(MissingFileError, match=r"model '/no/such/dir': no such directory \(expected a model dir"):
        load_open_qa("/no/such/dir")  # not huggingface_hub's "Repo id must use alphanumeric chars"
    with pytest.raises(ModelLoadError, match="finished' is an index, not a model: pass it as index="):
        load_open_qa(inputs / "finished")
    with pytest.raises(ModelLoadError, match="mixed' holds no config.json: expected a model directory"):
        load_open_qa(inputs / "mixed")  # not "holds no documents"
    with pytest.raises(ModelLoadError, match="good.jsonl' is a file; expected a model directory or a Hub repo id"):
        load_open_qa(inputs / "good.jsonl")


def test_numbers_as_answers_are_read_as_the_strings_they_spell(tmp_path):
    """`"answers": 1999` used to end in "TypeError: 'int' object is not iterable" in evaluate and train."""
    from realm_hf.cli.evaluate import read_questions
    from realm_hf.cli.train import _load_rows

    data = tmp_path / "years.jsonl"
    data.write_text('{"question": "When?", "answers": 1999}\n{"question": "And?", "answers": [2001, "MMI"]}\n')
    assert read_questions(data)[1] == [["1999"], ["2001", "MMI"]]
    rows = _load_rows(str(data), None, "train")
    assert len(rows) == 2
