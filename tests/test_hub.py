"""Hub uploads against a fake Hub on 127.0.0.1 (tests/fake_hub.py): `realm_hf.hub.push_to_hub`, `realm-hf push` and
`RealmForOpenQA.push_to_hub` each make one commit with the model, tokenizer, retriever files, index and our card.

huggingface_hub reads HF_ENDPOINT when it is imported, and this process has imported it offline (conftest.py), so the
uploads run in subprocesses pointed at the fake Hub; the checks that fail before any request run here.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from fake_hub import FakeHub, FakeRepo

from realm_hf import RealmForOpenQA
from realm_hf.cli.main import main
from realm_hf.demo import build_demo_model
from realm_hf.hub import check_checkpoint_dir, push_to_hub
from realm_hf.retrieval import DocumentStore, RealmRetriever, write_index

GENERIC_CARD = "This is the model card of a 🤗 transformers model that has been pushed on the Hub."

# Runs in a subprocess with HF_ENDPOINT set; prints one JSON line of results.
PUSH_SCRIPT = textwrap.dedent(
    """
    import json, shutil, sys
    from pathlib import Path
    from transformers import PreTrainedModel
    from realm_hf import RealmForOpenQA
    from realm_hf.hub import push_to_hub

    checkpoint, index, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    results = {}
    results["directory"] = push_to_hub(checkpoint, "user/realm-demo", index_dir=index).oid

    model = RealmForOpenQA.from_pretrained(checkpoint)
    results["model"] = model.push_to_hub("user/realm-model").oid
    results["model_again"] = model.push_to_hub("user/realm-model", tags=["extra-tag"]).oid

    PreTrainedModel.push_to_hub(model, "user/was-generic")  # Transformers' own push: its generic card
    results["replaces_generic"] = model.push_to_hub("user/was-generic").oid

    own = work / "own-readme"
    shutil.copytree(checkpoint, own)
    (own / "README.md").write_text("---\\nlicense: mit\\n---\\n# My own card\\n", encoding="utf-8")
    results["own_readme"] = push_to_hub(own, "user/own-readme").oid
    print(json.dumps(results))
    """
)


def _hub_env(hub: FakeHub, home: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_XET="1",
        HF_HOME=str(home),
        HF_HUB_CACHE=str(home / "hub"),
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    return env


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("checkpoint"))


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, checkpoint_dir) -> Path:
    directory = tmp_path_factory.mktemp("index")
    model = RealmForOpenQA.from_pretrained(checkpoint_dir)
    write_index(model.block_emb, directory, shard_size=10)  # 16 blocks: two shards
    records = RealmRetriever.from_pretrained(checkpoint_dir).block_records
    DocumentStore.from_block_records(records).save(directory / "documents")
    return directory


@pytest.fixture(scope="module")
def pushed(tmp_path_factory, checkpoint_dir, index_dir):
    """Runs the API pushes and the CLI push (two subprocesses, at the same time) against one fake Hub."""
    work = tmp_path_factory.mktemp("push")
    with FakeHub(lifetime_s=600) as hub:
        env = _hub_env(hub, work / "home")
        api = subprocess.Popen(
            [sys.executable, "-c", PUSH_SCRIPT, str(checkpoint_dir), str(index_dir), str(work)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "realm_hf.cli",
                "push",
                str(checkpoint_dir),
                "user/cli-repo",
                "--index",
                str(index_dir),
                "--private",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        api_out, api_err = api.communicate(timeout=540)
        cli_out, cli_err = cli.communicate(timeout=60)
    assert api.returncode == 0, api_err[-4000:]
    assert cli.returncode == 0, cli_err[-4000:]
    return hub, json.loads(api_out.strip().splitlines()[-1]), cli_out


def _front_matter(readme: bytes) -> dict:
    text = readme.decode("utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def _expected_files(checkpoint_dir: Path, index_dir: Path) -> dict[str, bytes]:
    files = {path.name: path.read_bytes() for path in checkpoint_dir.iterdir() if path.is_file()}
    files.update(
        {
            f"index/{path.relative_to(index_dir).as_posix()}": path.read_bytes()
            for path in index_dir.rglob("*")
            if path.is_file()
        }
    )
    return files


def test_push_uploads_everything_in_one_commit(pushed, checkpoint_dir, index_dir):
    hub, results, _ = pushed
    (commit,) = hub.commits_to("user/realm-demo")
    assert commit.oid == results["directory"] and commit.summary == "Upload REALM checkpoint with realm_hf"
    expected = _expected_files(checkpoint_dir, index_dir)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "vocab.txt",
        "tokenizer_config.json",
        "block_records.safetensors",
        "index/index.json",
        "index/embeddings-00000.safetensors",
        "index/embeddings-00001.safetensors",
        "index/documents/document_store.json",
    ):
        assert name in commit.files, name
    for name, data in expected.items():
        assert commit.files[name] == data, f"{name} arrived changed"
    assert set(commit.files) == set(expected) | {"README.md"}


def test_push_generates_our_card(pushed):
    hub, _, _ = pushed
    readme = hub.repos["user/realm-demo"].files["README.md"]
    metadata = _front_matter(readme)
    assert metadata["library_name"] == "realm_hf" and metadata["pipeline_tag"] == "question-answering"
    assert "realm" in metadata["tags"]
    text = readme.decode()
    assert 'pipeline("open-qa", model="user/realm-demo")' in text
    assert 'ExactSearcher.from_index(f"{local}/index")' in text  # the card knows about the uploaded index


def test_cli_push_makes_one_private_commit(pushed, checkpoint_dir, index_dir):
    hub, _, cli_out = pushed
    (commit,) = hub.commits_to("user/cli-repo")
    assert hub.repos["user/cli-repo"].visibility == "private"
    assert set(commit.files) == set(_expected_files(checkpoint_dir, index_dir)) | {"README.md"}
    assert _front_matter(commit.files["README.md"])["library_name"] == "realm_hf"
    assert f"user/cli-repo/commit/{commit.oid}" in cli_out


def test_model_push_to_hub_sends_our_card(pushed):
    hub, results, _ = pushed
    first, second = hub.commits_to("user/realm-model")
    assert first.oid == results["model"] and second.oid == results["model_again"]
    assert {"config.json", "model.safetensors", "README.md"} <= set(first.files)
    metadata = _front_matter(first.files["README.md"])
    assert metadata["library_name"] == "realm_hf" and metadata["pipeline_tag"] == "question-answering"
    assert GENERIC_CARD not in first.files["README.md"].decode()
    assert "RealmForOpenQA" in first.files["README.md"].decode()
    # The second push keeps the card already in the repo and adds the new tag to it.
    again = _front_matter(second.files["README.md"])
    assert again["tags"] == [*metadata["tags"], "extra-tag"]
    assert (
        second.files["README.md"].decode().split("---\n", 2)[2]
        == first.files["README.md"].decode().split("---\n", 2)[2]
    )


def test_model_push_replaces_transformers_generic_card(pushed):
    hub, results, _ = pushed
    generic, ours = hub.commits_to("user/was-generic")
    assert GENERIC_CARD in generic.files["README.md"].decode()  # what Transformers alone uploads
    assert ours.oid == results["replaces_generic"]
    assert _front_matter(ours.files["README.md"])["library_name"] == "realm_hf"


def test_push_keeps_the_directory_readme(pushed):
    hub, _, _ = pushed
    (commit,) = hub.commits_to("user/own-readme")
    assert commit.files["README.md"] == b"---\nlicense: mit\n---\n# My own card\n"


def test_fake_hub_saw_only_known_requests(pushed):
    hub, _, _ = pushed
    assert hub.unknown_requests == []
    assert any(request.startswith("HEAD /user/realm-model/resolve/main/README.md") for request in hub.requests)


# -- checks that fail before any request ---------------------------------------------------------------------------


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        check_checkpoint_dir(tmp_path)
    assert (
        "config.json" in str(error.value) and "model weights" in str(error.value) and "tokenizer" in str(error.value)
    )

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "realm", "architectures": ["RealmReader"]}))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001.safetensors"}})
    )
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(FileNotFoundError, match=r"model-00001.safetensors \(a weights shard listed in"):
        push_to_hub(tmp_path, "user/x")

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type 'bert', expected 'realm'"):
        push_to_hub(tmp_path, "user/x")


def test_bad_index_is_refused(tmp_path, checkpoint_dir, index_dir):
    with pytest.raises(ValueError, match=r"index_dir= expects an index directory holding index\.json"):
        push_to_hub(checkpoint_dir, "user/x", index_dir=tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "index.json").write_bytes((index_dir / "index.json").read_bytes())
    with pytest.raises(ValueError, match=r"index_dir= '.*broken' is damaged: .*embeddings-00000.safetensors"):
        push_to_hub(checkpoint_dir, "user/x", index_dir=broken)


@pytest.fixture
def hub_calls(monkeypatch) -> list[str]:
    """The HfApi calls a push makes, none of which is let through: a check that fails first leaves the list empty."""
    import realm_hf.hub

    calls = []
    for name in ("create_repo", "create_branch", "create_commit", "upload_folder"):

        def refuse(*args, _name=name, **kwargs):
            calls.append(_name)
            raise AssertionError(f"HfApi.{_name} was called: the push reached the network")

        monkeypatch.setattr(realm_hf.hub.HfApi, name, refuse)
    return calls


def _damage(index: Path, how: str) -> None:
    if how == "missing shard":
        (index / "embeddings-00001.safetensors").unlink()
    elif how == "no index.json":
        (index / "index.json").unlink()
    elif how == "unfinished build":
        (index / "build.json").write_text("{}")
    elif how == "truncated shard":
        shard = index / "embeddings-00000.safetensors"
        shard.write_bytes(shard.read_bytes()[:-40])
    elif how == "documents of another count":
        import shutil

        records = RealmRetriever.from_pretrained(index.parent / "checkpoint").block_records
        shutil.rmtree(index / "documents")
        DocumentStore.from_block_records(records[:5]).save(index / "documents")


@pytest.mark.parametrize(
    "how, expected",
    [
        ("missing shard", "is damaged: index shard {index}/embeddings-00001.safetensors is missing; expected the "
                          "manifest, shards and documents/ that `realm-hf index build` writes"),
        ("no index.json", "is an unfinished `realm-hf index build` (it has no index.json yet)"),
        ("unfinished build", "holds an unfinished build or `index add` (build.json is still there); expected a "
                             "finished index"),
        ("truncated shard", "is damaged: {index}/embeddings-00000.safetensors is truncated: expected "),
        ("documents of another count", "is damaged: {index} is inconsistent: 5 documents in {index}/documents but 16 "
                                       "embedded blocks"),
    ],
)  # fmt: skip
def test_cli_push_names_a_damaged_index_before_sending_anything(tmp_path, checkpoint_dir, index_dir, hub_calls,
                                                                capsys, how, expected):  # fmt: skip
    import shutil

    shutil.copytree(checkpoint_dir, tmp_path / "checkpoint")
    index = shutil.copytree(index_dir, tmp_path / "index")
    _damage(index, how)
    assert main(["push", str(tmp_path / "checkpoint"), "user/x", "--index", str(index)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"realm-hf push: error: --index {str(index)!r} "), last
    assert expected.format(index=index) in last, last
    assert hub_calls == []


def test_cli_push_refuses_an_index_of_another_dimension(tmp_path, checkpoint_dir, index_dir, hub_calls, capsys):
    import shutil

    import torch

    dim = json.loads((checkpoint_dir / "config.json").read_text())["retriever_proj_size"]
    index = tmp_path / "index"
    write_index(torch.randn(16, dim // 2), index, shard_size=10)
    shutil.copytree(index_dir / "documents", index / "documents")  # the right documents, embedded by another model
    assert main(["push", str(checkpoint_dir), "user/x", "--index", str(index)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"realm-hf push: error: --index {str(index)!r} holds {dim // 2}-d block embeddings but the model's "
                    f"embedder makes {dim}-d ones (config.retriever_proj_size): build the index with this model's "
                    "embedder (realm-hf index build --model ...).")  # fmt: skip
    assert hub_calls == []
    with pytest.raises(ValueError, match=rf"index_dir= '.*' holds {dim // 2}-d block embeddings"):
        push_to_hub(checkpoint_dir, "user/x", index_dir=index)
    assert hub_calls == []


def test_cli_push_refuses_an_index_of_other_documents(tmp_path, checkpoint_dir, hub_calls, capsys):
    """An index without documents/ is read with the checkpoint's block records: it must have one block per record."""
    model = RealmForOpenQA.from_pretrained(checkpoint_dir)
    index = tmp_path / "index"
    write_index(model.block_emb[:10], index)
    assert main(["push", str(checkpoint_dir), "user/x", "--index", str(index)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"realm-hf push: error: --index {str(index)!r} holds 10 blocks and no documents/ of its own, but "
                    f"the documents it would be read with, {checkpoint_dir / 'block_records.safetensors'}, hold "
                    f"{model.block_emb.shape[0]}: expected an index built over these documents (block ids would "
                    "point at the wrong text); build it with `realm-hf index build`, which keeps them in documents/")  # fmt: skip
    assert hub_calls == []


def test_cli_push_checks_a_good_index_and_goes_on(checkpoint_dir, index_dir, hub_calls, capsys):
    """The index checks pass a good index: the push gets as far as the Hub (refused here)."""
    assert main(["push", str(checkpoint_dir), "user/x", "--index", str(index_dir)]) == 1
    assert "HfApi.create_repo was called" in capsys.readouterr().err
    assert hub_calls == ["create_repo"]


def test_cli_push_reports_a_bad_directory(tmp_path, capsys):
    assert main(["push", str(tmp_path / "missing"), "user/x"]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert main(["push", str(tmp_path), "user/x"]) == 1
    assert "missing: config.json" in capsys.readouterr().err


def test_cli_push_the_hub_refuses_says_so_and_how_to_log_in(tmp_path, checkpoint_dir):
    """A Hub that answers 401 (no token, or a bad one) was reported as one that could not be reached."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def refuse(self):
            body = b'{"error": "Invalid credentials in Authorization header"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = refuse

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HOME=str(tmp_path / "home"),
               HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")  # fmt: skip
    try:
        run = subprocess.run([sys.executable, "-m", "realm_hf_cli", "push", str(checkpoint_dir), "user/x"], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        server.shutdown()
    assert run.returncode == 1, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"realm-hf push: error: the Hub refused to push {checkpoint_dir} to user/x (HTTP 401): no "
                           "token was found, or it is not valid; log in with `hf auth login`"), last  # fmt: skip


def test_help_lists_push(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "push" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["push", "--help"])
    out = capsys.readouterr().out
    assert "--index" in out and "--private" in out and "one commit" in out


def test_a_generated_card_names_the_hub_model_it_was_loaded_from(tmp_path):
    from conftest import tiny_config

    from realm_hf import RealmEmbedder
    from realm_hf.hub import _hub_base_model

    model = RealmEmbedder(tiny_config())
    model.config.name_or_path = "google/realm-cc-news-pretrained-embedder"
    assert _hub_base_model(model, "me/my-embedder") == "google/realm-cc-news-pretrained-embedder"
    assert _hub_base_model(model, "google/realm-cc-news-pretrained-embedder") is None  # pushing back to its own repo
    model.config.name_or_path = str(tmp_path)  # loaded from a directory
    assert _hub_base_model(model, "me/my-embedder") is None


def test_fake_hub_logs_unknown_requests_and_stops_itself():
    import http.client
    import time

    with FakeHub(lifetime_s=1.0) as hub:
        host, port = hub.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=5)
        connection.request("GET", "/api/whoami-v2")
        response = connection.getresponse()
        assert response.status == 404 and response.read()
        connection.request("HEAD", "/user/none/resolve/main/README.md")  # same connection: HEAD replies carry no body
        response = connection.getresponse()
        assert (response.status, response.getheader("X-Error-Code"), response.read()) == (404, "RepoNotFound", b"")
        assert hub.unknown_requests == ["GET /api/whoami-v2"]
        connection.close()
        time.sleep(1.5)  # past its lifetime: the server has shut itself down
        with pytest.raises(OSError):
            http.client.HTTPConnection(host, int(port), timeout=2).request("GET", "/")


CHECK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from realm_hf.checkpoints import check_hub_model
    from realm_hf.errors import ModelLoadError

    found = {}
    for name in sys.argv[1:]:
        try:
            check_hub_model(name)
            found[name] = "ok"
        except ModelLoadError as error:
            found[name] = str(error)
    print(json.dumps(found))
    """
)


def test_a_model_name_the_hub_cannot_have_is_refused_at_once_saying_why(tmp_path):
    """`check_hub_model` (run before `realm-hf ask`/`index build` and `load_open_qa` read anything): one request per
    name, and the message says whether the repo is missing, holds no model, or the Hub is unreachable."""
    with FakeHub(lifetime_s=120) as hub:
        hub.repos["user/model"] = FakeRepo("user/model", None, files={"config.json": b"{}"})
        hub.repos["user/data-only"] = FakeRepo("user/data-only", None, files={"data.txt": b"x"})
        env = _hub_env(hub, tmp_path / "home")
        run = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, "user/model", "user/data-only", "user/missing"],
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["user/model"] == "ok"
    assert "'user/data-only' has no config.json: it holds no Transformers model" in found["user/data-only"]
    assert "'user/missing' is neither a directory here" in found["user/missing"]
    assert "or the repo is private" in found["user/missing"]
    assert "Retrying" not in run.stderr

    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env["HF_ENDPOINT"] = closed
    run = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, "user/model"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert "the Hub could not be reached" in json.loads(run.stdout.splitlines()[-1])["user/model"], run.stderr[-2000:]
    assert "Retrying" not in run.stderr  # huggingface_hub's own retries take 23 s per file


def test_push_leaves_out_what_training_left_beside_the_model(tmp_path):
    from realm_hf.hub import _visible_files

    for name in ["config.json", "model.safetensors", "train_results.json", "checkpoint-5/model.safetensors",
                 "checkpoint-5/optimizer.pt", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin",
                 ".hidden", "index/documents/checkpoint-1"]:  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    found = [path.relative_to(tmp_path).as_posix() for path in _visible_files(tmp_path)]
    # the Trainer's checkpoints and state (pickled, gigabytes) stay home; a file of that name deeper down is not theirs
    assert found == ["config.json", "model.safetensors", "train_results.json", "index/documents/checkpoint-1"]


def test_cli_push_without_a_network_says_so(checkpoint_dir, monkeypatch, capsys):
    import realm_hf.hub

    # huggingface_hub's transport error, whichever HTTP library it uses (httpx2 today)
    connect_error = type("ConnectError", (Exception,), {"__module__": "httpx2"})

    def unreachable(*args, **kwargs):
        raise connect_error("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(realm_hf.hub.HfApi, "create_repo", unreachable)
    assert main(["push", str(checkpoint_dir), "user/x"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("realm-hf push: error: could not reach the Hub to push") and "ConnectError" in last
    assert "report it" not in last
