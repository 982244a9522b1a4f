"""`realm-hf pretrain` on the inputs people give it: a JSONL file or a folder of text files with the async refresher, an
open-QA checkpoint as --embedder, an output directory of an earlier run over another corpus, an empty corpus, and
options naming what is not there. Each error is one line, `realm-hf pretrain: error: ...`, said before models load.

The runs go through `realm_hf.cli.main.main` in this process (a process of its own costs ~10 s of imports), over the
untrained demo model and a corpus of 12 dated sentences: about 15 s of training each on 2 CPU cores."""

import json
import multiprocessing
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from realm_hf import RealmEmbedder, RealmKnowledgeAugEncoder, RealmTokenizer
from realm_hf.cli.main import main as cli_main
from realm_hf.demo import ensure_demo_model
from realm_hf.retrieval import ExactSearcher, embed_blocks
from realm_hf.retrieval.document_store import MANIFEST_NAME
from realm_hf.retrieval.index_files import read_manifest
from realm_hf.training import IndexRefresher, RealmForPretraining
from realm_hf.training.index_refresh import IndexRefresherError

FACTS = [
    ("Penicillin", "Fleming discovered penicillin in 1928."), ("Moon landing", "Apollo 11 landed on the Moon in 1969."),
    ("Hamlet", "Shakespeare wrote Hamlet around 1600."), ("Eiffel Tower", "The Eiffel Tower was completed in 1889."),
    ("Berlin Wall", "The Berlin Wall fell in 1989."), ("Titanic", "The Titanic sank in 1912."),
    ("Relativity", "Einstein published special relativity in 1905."),
    ("Magna Carta", "The Magna Carta was sealed in 1215."),
    ("Printing press", "Gutenberg built his printing press around 1440."),
    ("Telephone", "Bell patented the telephone in 1876."), ("DNA", "Watson and Crick described DNA in 1953."),
    ("Columbus", "Columbus reached the Americas in 1492."),
]  # fmt: skip
OTHER_FACTS = [
    ("Hastings", "The Battle of Hastings was fought in 1066."), ("Revolution", "The French Revolution began in 1789."),
    ("Internet", "ARPANET sent its first message in 1969."), ("Vaccine", "Jenner tested his smallpox vaccine in 1796."),
]  # fmt: skip


def _write_jsonl(path: Path, facts) -> Path:
    path.write_text(
        "".join(json.dumps({"title": title, "text": text}) + "\n" for title, text in facts), encoding="utf-8"
    )
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The demo model (a RealmForOpenQA checkpoint), the 12 facts as JSONL and as a folder of text files (two files of
    six paragraphs), and 4 other facts as JSONL."""
    root = tmp_path_factory.mktemp("pretrain_inputs")
    texts = root / "texts"
    texts.mkdir()
    for number, half in enumerate((FACTS[:6], FACTS[6:])):
        (texts / f"part{number}.txt").write_text("\n\n".join(text for _, text in half) + "\n", encoding="utf-8")
    return {"root": root, "demo": ensure_demo_model(root / "demo"), "docs12": _write_jsonl(root / "docs12.jsonl", FACTS),
            "docs4": _write_jsonl(root / "docs4.jsonl", OTHER_FACTS), "texts": texts}  # fmt: skip


def _command(work, documents, output, *extra) -> list[str]:
    return ["pretrain", "--embedder", str(work["demo"]), "--documents", str(documents), "--output-dir", str(output),
            "--max-steps", "2", "--quiet", "--block-length", "64", "--query-length", "32", "--num-candidates", "4",
            "--batch-size", "4", "--logging-steps", "1", *extra]  # fmt: skip


def _last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("corpus", ["docs12", "texts"])
def test_async_refresh_reads_a_jsonl_file_or_a_folder_of_text_files(work, corpus, tmp_path, capfd, caplog):
    """The default --refresh async over a corpus that is no document store: the refresher reads the same documents
    (saved as a store in OUTPUT/refresh/documents/), and embeds them with the trained weights (an open-QA checkpoint's
    embedder saved with plain names, not `embedder.realm...` ones a RealmEmbedder would load as random weights)."""
    output = tmp_path / "out"
    assert cli_main(_command(work, work[corpus], output, "--refresh-every", "1")) == 0
    # One line (a warning: pytest captures it from logging) says which parts were taken, and no load report is shown.
    notes = [record.getMessage() for record in caplog.records if "RealmForOpenQA" in record.getMessage()]
    assert notes == [f"--embedder '{work['demo']}' is a RealmForOpenQA checkpoint: the embedder starts from its "
                     "embedder, the encoder starts from its reader's BERT and MLM head"]  # fmt: skip
    assert "LOAD REPORT" not in caplog.text + capfd.readouterr().err
    steps = [json.loads(line) for line in (output / "refresh" / "refresh_log.jsonl").read_text().splitlines()]
    assert steps and {step["mode"] for step in steps} == {"async"} and steps[-1]["step"] == 2
    store = json.loads((output / "refresh" / "documents" / MANIFEST_NAME).read_text())
    assert store["num_documents"] == 12
    assert store["fingerprint"] == json.loads((output / "corpus.json").read_text())["fingerprint"]
    assert all(key.startswith(("realm.", "cls.")) for key in load_file(output / "embedder" / "model.safetensors"))
    # OUTPUT/index/ is the corpus embedded by the saved (trained) embedder: the refresher loaded the real weights.
    embedder = RealmEmbedder.from_pretrained(output / "embedder")
    tokenizer = RealmTokenizer.from_pretrained(output / "embedder")
    titles = [title for title, _ in FACTS] if corpus == "docs12" else [f"part{i // 6}" for i in range(12)]
    expected = embed_blocks(embedder.eval(), tokenizer, [text for _, text in FACTS], titles, max_length=64)
    searcher = ExactSearcher.from_index(output / "index")
    torch.testing.assert_close(searcher.embeddings(torch.arange(12)), expected, rtol=1e-4, atol=1e-5)


def test_a_dead_refresher_names_the_command_line_flag(work, tmp_path, capfd, monkeypatch):
    """A refresher process that exits early (here at once, with code 3) ends the run with one line naming the exit
    code and `--refresh sync`, not Python's `mode='sync'` nor a RuntimeError "unexpected" report."""

    def spawn_one_that_dies(self):
        self._process = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
        self._process.start()
        self._process.join()

    monkeypatch.setattr(IndexRefresher, "_spawn", spawn_one_that_dies)
    assert cli_main(_command(work, work["docs12"], tmp_path / "out", "--refresh-every", "1")) == 1
    line = _last_line(capfd.readouterr().err)
    assert line.startswith("realm-hf pretrain: error: the index refresher process exited with code 3"), line
    assert "--refresh sync" in line and "mode=" not in line and "unexpected" not in line
    refresher = IndexRefresher(tmp_path / "lib", None, mode="async")
    refresher._process = type("Dead", (), {"is_alive": lambda self: False, "exitcode": 3})()
    with pytest.raises(IndexRefresherError, match="exited with code 3 .*mode='sync'") as error:
        refresher._check_process()
    assert isinstance(error.value, RuntimeError) and error.value.exitcode == 3


def test_the_files_of_a_run_over_another_corpus_are_not_reused(work, tmp_path, capfd):
    """OUTPUT/sentences.jsonl and OUTPUT/initial_index/ belong to the corpus in OUTPUT/corpus.json: an empty
    sentences.jsonl (left by an empty corpus before this check) is made again; a run over another corpus is refused
    while there are checkpoints to resume, starts clean with --no-resume, and, where no checkpoint was written,
    makes them again by itself."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "sentences.jsonl").write_text("")
    assert cli_main(_command(work, work["docs12"], output, "--refresh", "off")) == 0
    assert len((output / "sentences.jsonl").read_text().splitlines()) == 12
    capfd.readouterr()

    def sentences():
        return {json.loads(line)["text"] for line in (output / "sentences.jsonl").read_text().splitlines()}

    assert cli_main(_command(work, work["docs4"], output, "--refresh", "off")) == 2
    line = _last_line(capfd.readouterr().err)
    assert line.startswith(f"realm-hf pretrain: error: --output-dir '{output}' holds checkpoints of a run with another "
                           f"corpus ('{work['docs12']}': 12 documents"), line  # fmt: skip
    assert "--no-resume" in line and sentences() == {text for _, text in FACTS}

    (output / "index").mkdir()  # as an earlier run with a refresher leaves it
    assert cli_main(_command(work, work["docs4"], output, "--refresh", "off", "--no-resume")) == 0
    stderr = capfd.readouterr().err
    assert "note: --no-resume: removed the earlier run's checkpoints/" in stderr
    assert sentences() == {text for _, text in OTHER_FACTS}
    record = json.loads((output / "corpus.json").read_text())
    manifest = read_manifest(output / "initial_index")
    assert manifest["num_blocks"] == 4 and manifest["provenance"]["documents_fingerprint"] == record["fingerprint"]
    assert json.loads((output / "pretrain_results.json").read_text())["corpus_fingerprint"] == record["fingerprint"]
    assert not (output / "index").exists()  # not this run's embedder's, and --refresh off makes none

    # Interrupted before its first checkpoint: nothing to resume, so a run over docs12 starts afresh there.
    shutil.rmtree(output / "checkpoints")
    (output / "pretrain_results.json").unlink()
    assert cli_main(_command(work, work["docs12"], output, "--refresh", "off")) == 0
    assert "held the files of another run, not resumable (no checkpoint)" in capfd.readouterr().err
    assert sentences() == {text for _, text in FACTS} and read_manifest(output / "initial_index")["num_blocks"] == 12


def _no_corpus_reading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the corpus was read before the options were checked")

    monkeypatch.setattr("realm_hf.cli.corpus.open_corpus", refuse)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("output-file", "--output-dir '{a_file}' is a file; expected a directory to write the checkpoints, indexes "
                        "and pretrained parts in (a new one, or one of an earlier run to resume)"),
        ("output-under-file", "--output-dir '{a_file}/out' is inside {a_file}, which is a file; expected a directory "
                              "to write the checkpoints, indexes and pretrained parts in"),
        ("entities-missing", "--entities '{root}/nope.txt': no such file (expected a text file of entity names, one "
                             "per line)"),
        ("entities-directory", "--entities '{root}' is a directory; expected a text file of entity names"),
        ("ict-output", "--embedder '{root}/ict' is an ICT output (block_embedder/ and query_embedder/), not one model: "
                       "expected --embedder {root}/ict/block_embedder"),
    ],
)  # fmt: skip
def test_options_naming_what_is_not_there_are_usage_errors(work, tmp_path, capfd, monkeypatch, case, message):
    """Exit code 2 and one line naming the option, what was expected and what was received, before the corpus is
    read or a model loaded; nothing is written."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "ict" / "block_embedder").mkdir(parents=True)
    (tmp_path / "ict" / "block_embedder" / "config.json").write_text("{}")
    command = {
        "output-file": _command(work, work["docs12"], a_file),
        "output-under-file": _command(work, work["docs12"], a_file / "out"),
        "entities-missing": _command(work, work["docs12"], tmp_path / "out", "--entities", str(tmp_path / "nope.txt")),
        "entities-directory": _command(work, work["docs12"], tmp_path / "out", "--entities", str(tmp_path)),
        "ict-output": [*_command(work, work["docs12"], tmp_path / "out"), "--embedder", str(tmp_path / "ict")],
    }[case]
    _no_corpus_reading(monkeypatch)
    assert cli_main(command) == 2
    line = _last_line(capfd.readouterr().err)
    assert line.startswith("realm-hf pretrain: error: " + message.format(a_file=a_file, root=tmp_path)), line
    assert not (tmp_path / "out").exists()


def test_checkpoints_of_the_wrong_kind_are_refused_by_name(work, tmp_path, capfd, monkeypatch):
    """An encoder checkpoint or a BERT one as --embedder would start the retriever from random weights: refused,
    saying what --embedder expects and what it was given, before the corpus is read."""
    from transformers import BertConfig, BertForMaskedLM

    RealmForPretraining.from_parts(work["demo"], work["demo"]).save_parts(tmp_path / "parts")
    BertForMaskedLM(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(tmp_path / "bert")  # fmt: skip
    _no_corpus_reading(monkeypatch)
    expected = ("expected a RealmEmbedder checkpoint (e.g. ICT's block_embedder/), or a RealmForOpenQA, RealmScorer or "
                "RealmForPretraining checkpoint, whose embedder is used; received a")  # fmt: skip
    for given, received in ((tmp_path / "parts" / "encoder", " RealmKnowledgeAugEncoder checkpoint"),
                            (tmp_path / "bert", " 'bert' checkpoint")):  # fmt: skip
        command = [*_command(work, work["docs12"], tmp_path / "out"), "--embedder", str(given)]
        assert cli_main(command) == 1
        line = _last_line(capfd.readouterr().err)
        assert line.startswith(f"realm-hf pretrain: error: --embedder '{given}': {expected}{received}"), line
    # --encoder takes the BERT of an embedder: this one passes the check, and the run goes on to read the corpus.
    command = [*_command(work, work["docs12"], tmp_path / "out"), "--encoder", str(tmp_path / "parts" / "embedder")]
    assert cli_main(command) == 1
    assert "the corpus was read before the options were checked" in _last_line(capfd.readouterr().err)


def test_an_open_qa_checkpoint_gives_its_embedder_and_its_readers_bert(work, tmp_path):
    """`from_parts` of a RealmForOpenQA checkpoint: the embedder is its embedder, the encoder its reader's BERT and
    MLM head (the MLM decoder tied to the word embeddings); saved parts carry plain names and load back equal."""
    weights = load_file(work["demo"] / "model.safetensors")
    model = RealmForPretraining.from_parts(work["demo"], work["demo"])
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}  # the decoder's own are not read
    for prefix, part in (("embedder", model.embedder), ("reader", model.encoder)):
        for name, value in part.state_dict().items():
            if name not in tied:
                assert torch.equal(value, weights[f"{prefix}.{name}"]), name
    encoder = model.encoder
    assert encoder.cls.predictions.decoder.weight is encoder.realm.embeddings.word_embeddings.weight
    model.save_parts(tmp_path)
    assert not [key for key in load_file(tmp_path / "encoder" / "model.safetensors") if key.startswith("reader.")]
    again = RealmKnowledgeAugEncoder.from_pretrained(tmp_path / "encoder")
    for name, value in model.encoder.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name


@pytest.mark.parametrize(
    ("corpus", "message"),
    [
        ("empty", "--documents '{path}': expected at least one document with a text, found none (an empty corpus)"),
        ("no_span", "--documents '{path}': expected sentences with a salient span (a date, a title) to mask, found "
                    "none in its 1 documents; nothing to train on"),
        ("bad", "{name} line 1: expected JSON Lines (one JSON object per line), received invalid JSON"),
        ("missing", "--documents '{path}': no such file or directory (expected a document store directory, a JSONL"),
    ],
)  # fmt: skip
def test_a_corpus_that_cannot_be_trained_on_fails_before_models_load(work, tmp_path, capfd, monkeypatch, corpus,
                                                                     message):  # fmt: skip
    """Exit code 1, the `error:` line of every command, and nothing left in --output-dir (not even the directory)."""
    path = tmp_path / f"{corpus}.jsonl"
    if corpus != "missing":
        path.write_text({"empty": "", "no_span": json.dumps({"title": "Alpha", "text": "Nothing to mask here."}) + "\n",
                         "bad": '{"title": "x", "text": oops}\n'}[corpus])  # fmt: skip

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(RealmForPretraining, "from_parts", refuse)
    assert cli_main(_command(work, path, tmp_path / "out")) == 1
    line = _last_line(capfd.readouterr().err)
    assert line.startswith("realm-hf pretrain: error: " + message.format(path=path, name=path.name)), line
    assert not (tmp_path / "out").exists()


def test_help_says_what_documents_takes_and_when_an_index_is_written(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["pretrain", "--help"])
    assert done.value.code == 0
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "a document store directory (or an index directory holding one), a JSONL / CSV / TSV / Parquet file" in text
    assert "or a text or Markdown file or folder of them" in text
    assert "with --refresh async or sync only: --refresh off leaves none" in text
    assert "A RealmForOpenQA checkpoint (e.g. the demo model) works as --embedder" in text
