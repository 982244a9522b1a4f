"""`realm-hf serve` over HTTP: the page and its assets, POST /api/ask over a tiny real pipeline (batches, top-k, corpus
markup returned verbatim), every bad request as a 4xx JSON error, the Host check, and the command itself (a live
server on 127.0.0.1, a busy port, a missing extra, --index)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra: pip install 'realm_hf[serve]'")

from serving_helpers import HOSTILE_RECORDS, QUESTION, build_tiny_open_qa, live_server  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from realm_hf.cli import serve as serve_cli  # noqa: E402
from realm_hf.cli.main import main  # noqa: E402
from realm_hf.serving import PipelineAnswerer, create_app  # noqa: E402

QUESTIONS = [QUESTION, "the first record", "want the fifth"]


@pytest.fixture(scope="module")
def tiny_open_qa(tmp_path_factory):
    return build_tiny_open_qa(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def client(tiny_open_qa):
    app = create_app(PipelineAnswerer(tiny_open_qa, batch_size=2), model_name="tiny <model>", examples=["a?", "b?"],
                     max_questions=4, max_top_k=5, max_question_chars=100)  # fmt: skip
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        yield test_client


# Requests go through httpx2: huggingface_hub's HTTP client, so always installed (and Starlette's TestClient's).
def _ask(client, payload, headers=None):
    headers = {"Content-Type": "application/json", **(headers or {})}
    return client.post("/api/ask", content=json.dumps(payload), headers=headers)


# ---------------------------------------------------------------------------------------------------------------------
# the page


def test_the_page_and_its_assets_are_served_with_a_strict_content_security_policy(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<form id="ask-form"' in page.text and 'src="static/app.js"' in page.text
    policy = page.headers["content-security-policy"]
    # Scripts only from this server: no inline script or event handler could run, even if markup got in.
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    script = client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "api/ask" in script.text
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/missing.js").status_code == 404


def test_info_names_the_model_examples_and_limits(client):
    assert client.get("/api/info").json() == {"model": "tiny <model>", "examples": ["a?", "b?"], "max_questions": 4,
                                              "max_top_k": 5, "max_question_chars": 100}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# answering


def test_a_batch_gets_the_pipelines_answers_in_order_with_ranks(client, tiny_open_qa):
    response = _ask(client, {"questions": QUESTIONS, "top_k": 3})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    results = response.json()
    assert [result["question"] for result in results] == QUESTIONS
    expected = tiny_open_qa(QUESTIONS, top_k=3)
    for result, answers in zip(results, expected, strict=True):
        assert [answer["rank"] for answer in result["answers"]] == [1, 2, 3]
        for got, want in zip(result["answers"], answers, strict=True):
            assert got.pop("rank") and got.pop("score") == pytest.approx(want.pop("score"), rel=1e-5)
            assert got == want
        # the tiny model has no calibration: the pipeline's flag passes through, and it never abstains
        assert all(answer["abstained"] is False for result in results for answer in result["answers"])


def test_answers_quote_the_corpus_verbatim_markup_included(client):
    for result in _ask(client, {"questions": QUESTIONS, "top_k": 5}).json():
        for answer in result["answers"]:
            record = HOSTILE_RECORDS[answer["block_id"]]
            assert answer["title"] == record["title"]
            assert answer["evidence"] == f"{record['title']}: {record['text']}"
            assert answer["evidence"][answer["start"] : answer["end"]] == answer["answer"]
            assert "<img" in answer["evidence"] and "<script>" in answer["evidence"]  # JSON is not HTML-escaped


def test_top_k_defaults_to_one_and_questions_are_stripped(client, tiny_open_qa):
    (result,) = _ask(client, {"questions": [f"  {QUESTION}\n"]}).json()
    assert result["question"] == QUESTION and len(result["answers"]) == 1
    assert result["answers"][0]["answer"] == tiny_open_qa(QUESTION)["answer"]


# ---------------------------------------------------------------------------------------------------------------------
# bad requests


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"questions": [""]}, 400, r"^the question is empty: type a question\.$"),
        ({"questions": ["ok?", "   "]}, 400, r"questions\[1\] is empty"),
        ({"questions": []}, 400, r"'questions' to be a non-empty list of strings, got array \[\]"),
        ({"question": "ok?"}, 400, r"unknown keys \['question'\]"),
        ({"top_k": 1}, 400, "'questions' to be a non-empty list of strings, got null"),
        ({"questions": "ok?"}, 400, 'non-empty list of strings, got string "ok\\?"'),
        ({"questions": ["ok?", 3]}, 400, r"questions\[1\] to be a string, got number 3"),
        ({"questions": ["ok?"] * 5}, 400, "at most 4 questions per request, got 5"),
        ({"questions": ["x" * 101]}, 400, r"at most 100 characters, questions\[0\] has 101"),
        ({"questions": ["ok?"], "top_k": 0}, 400, "'top_k' to be an integer from 1 to 5, got 0"),
        ({"questions": ["ok?"], "top_k": 6}, 400, "from 1 to 5, got 6"),
        ({"questions": ["ok?"], "top_k": "3"}, 400, "from 1 to 5, got '3'"),
        ({"questions": ["ok?"], "top_k": True}, 400, "from 1 to 5, got True"),
        (["ok?"], 400, r'a JSON object \{"questions": \[...\], "top_k": n\}, got array \["ok\?"\]'),
        ({"questions": ["caf\udce9?"]}, 400, r"^the question: expected Unicode text, received a lone surrogate"),
        ({"questions": ["ok?", "?!"]}, 400, r"questions\[1\]: expected a question in words"),
    ],
)
def test_bad_requests_get_a_json_error_naming_what_was_expected(client, payload, status, message):
    response = _ask(client, payload)
    assert response.status_code == status and response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"error"}
    assert re.search(message, response.json()["error"]), response.json()["error"]


def test_bodies_that_are_not_json_are_refused(client):
    response = client.post("/api/ask", content='{"questions": ["ok?"]', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "invalid JSON" in response.json()["error"]
    # A form post (which another site's page could send without a CORS preflight) is refused.
    response = client.post("/api/ask", content="questions=ok", headers={"Content-Type": "text/plain"})
    assert (
        response.status_code == 415 and "Content-Type: application/json), got 'text/plain'" in response.json()["error"]
    )
    response = client.post("/api/ask", content=b" " * ((1 << 20) + 1), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    wrong_method = client.get("/api/ask")
    assert wrong_method.status_code == 405 and wrong_method.json() == {
        "error": "GET /api/ask: Method Not Allowed; expected GET /api/info, POST /api/ask"
    }
    assert client.get("/api/nothing").json()["error"].startswith("GET /api/nothing: Not Found; expected GET /")


def test_only_loopback_host_names_are_accepted_by_default(client, tiny_open_qa):
    # Another site reaching the server through a DNS name it controls (DNS rebinding) is refused.
    refused = client.get("/", headers={"Host": "evil.example"})
    assert refused.status_code == 400 and refused.json() == {"error": "Host 'evil.example' is not accepted: this server "
                                                              "answers requests addressed to 127.0.0.1 or localhost "
                                                              "(`realm-hf serve --host 0.0.0.0` serves requests from "
                                                              "other machines)"}  # fmt: skip
    assert _ask(client, {"questions": ["ok?"]}, headers={"Host": "evil.example:8000"}).status_code == 400
    assert client.get("/", headers={"Host": "localhost:8000"}).status_code == 200
    app = create_app(PipelineAnswerer(tiny_open_qa), allowed_hosts=None)
    with TestClient(app, base_url="http://qa.example.org") as open_client:
        assert open_client.get("/").status_code == 200


def test_a_failing_model_gives_a_json_500_and_the_server_goes_on(tiny_open_qa):
    calls = []

    def answer_fn(questions, top_k):
        calls.append(questions)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (say)")
        if len(calls) == 2:
            return []  # a broken answer function: one list per question is the contract
        return PipelineAnswerer(tiny_open_qa)(questions, top_k)

    with TestClient(create_app(answer_fn), base_url="http://127.0.0.1") as client:
        first = _ask(client, {"questions": ["ok?"]})
        assert first.status_code == 500
        assert first.json() == {"error": "the model failed: RuntimeError: CUDA out of memory (say)"}
        second = _ask(client, {"questions": ["ok?"]})
        assert second.status_code == 500 and "returned 0 answer lists for 1 questions" in second.json()["error"]
        assert _ask(client, {"questions": ["ok?"]}).status_code == 200


# ---------------------------------------------------------------------------------------------------------------------
# the command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_live_server_answers_real_http_requests(tiny_open_qa):
    import httpx2 as httpx

    with live_server(create_app(PipelineAnswerer(tiny_open_qa), model_name="tiny")) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/api/info", timeout=10.0).json()["model"] == "tiny"
        response = httpx.post(f"{url}/api/ask", json={"questions": QUESTIONS, "top_k": 2}, timeout=60.0)
        assert response.status_code == 200
        assert [result["question"] for result in response.json()] == QUESTIONS
        assert [len(result["answers"]) for result in response.json()] == [2, 2, 2]
        empty = httpx.post(f"{url}/api/ask", json={"questions": [""]}, timeout=10.0)
        assert empty.status_code == 400 and empty.json() == {"error": "the question is empty: type a question."}
        assert httpx.get(url, headers={"Host": "evil.example"}, timeout=10.0).status_code == 400


@pytest.mark.slow  # a second process that imports torch and loads a model: tens of seconds on a busy machine
def test_serve_answers_over_http_from_a_model_directory(tmp_path):
    import httpx2 as httpx

    from realm_hf.demo import ensure_demo_model

    model_dir = ensure_demo_model(tmp_path / "demo")
    port = _free_port()
    command = [sys.executable, "-m", "realm_hf.cli", "serve", "--model", str(model_dir), "--port", str(port),
               "--log-level", "warning"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(serve_cli.__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):  # at most 2 minutes: the process imports torch and loads the model
            if server.poll() is not None:
                break
            try:
                info = httpx.get(f"{base}/api/info", timeout=5.0)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert server.poll() is None, server.stdout.read()
        assert info.json()["model"] == str(model_dir)
        response = httpx.post(f"{base}/api/ask", json={"questions": ["Who wrote Hamlet?", "Where does the Nile flow?"],
                                                       "top_k": 2}, timeout=60.0)  # fmt: skip
        assert response.status_code == 200
        results = response.json()
        assert [len(result["answers"]) for result in results] == [2, 2]
        for answer in (answer for result in results for answer in result["answers"]):
            assert answer["evidence"][answer["start"] : answer["end"]] == answer["answer"] != ""
        assert httpx.post(f"{base}/api/ask", json={"questions": [""]}, timeout=10.0).status_code == 400
        assert "realm-hf" in httpx.get(base, timeout=10.0).text
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn shuts down gracefully on Ctrl+C
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    assert server.returncode == 0, output
    assert f"serving on http://127.0.0.1:{port}" in output


def test_a_busy_port_is_reported_before_loading_the_model(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # an empty directory as the model: loading it would fail, so an error that is not about it came first
        assert main(["serve", "--model", str(tmp_path), "--port", str(port)]) == 1
    error = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in error and "Pass another --port" in error
    assert "loading" not in error


@pytest.mark.parametrize(
    "host, received",
    [
        ("999.1.1.1", "is not a valid IP address"),
        ("no-such-host.invalid", "is not an IP address or a host name that resolves"),
        ("192.0.2.1", "is not an address of this machine"),  # TEST-NET-1: a valid address, but not this machine's
    ],
)
def test_a_host_that_cannot_be_listened_on_is_named_before_loading_the_model(host, received, capsys, tmp_path):
    """Nothing is served: the address is tried (bound, never listened on) before the model loads, and refused."""
    assert main(["serve", "--model", str(tmp_path), "--host", host, "--port", "8765"]) == 1
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1, error
    assert error.startswith(f"realm-hf serve: error: --host {host!r} {received} ("), error
    assert error.rstrip().endswith("; expected an address of this machine, such as 127.0.0.1 (this machine only) or "
                                   "0.0.0.0 (all interfaces)"), error  # fmt: skip
    assert "Traceback" not in error and "--port" not in error


def test_a_missing_extra_names_the_extra_to_install(monkeypatch, capsys):
    monkeypatch.setattr(serve_cli, "EXTRA_MODULES", ("starlette", "realm_hf_no_such_module"))
    assert main(["serve"]) == 1
    expected = "realm-hf serve: error: needs the 'serve' extra (realm_hf_no_such_module not installed): pip install 'realm_hf[serve]'"
    assert capsys.readouterr().err == expected + "\n"


def test_bad_ports_are_usage_errors(capsys):
    for port in ("0", "65536", "http"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--port", port])
        assert exit_info.value.code == 2
        assert f"expected a port number from 1 to 65535, got '{port}'" in capsys.readouterr().err
