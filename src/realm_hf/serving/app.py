"""The web app of `realm-hf serve`: one static page (HTML, CSS and a little vanilla JS) and a JSON endpoint.

Routes:

- `GET /`: the page. Its script renders every answer with DOM text nodes (never HTML), so corpus text shows as text.
- `GET /static/...`: the page's script and style sheet.
- `GET /api/info`: `{"model", "examples", "max_questions", "max_top_k", "max_question_chars"}`, for the page.
- `POST /api/ask` with `{"questions": [str, ...], "top_k": int}` (`top_k` optional, 1 by default): a list with one
  `{"question", "answers"}` per question, in order; `answers` is best first, each a dict of the answer function's
  (for a pipeline: `rank`, `answer`, `score`, `start`, `end`, `block_id`, `title`, `evidence`, and `abstained` when the
  pipeline flags low confidence). Bad requests get a 4xx status and `{"error": message}`.

The app only imports Starlette: the answer function is injected (`create_app(answer_fn)`).
"""

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from transformers.utils import logging

from ..pipelines.questions import question_problem

logger = logging.get_logger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
# Host headers accepted by default: a page on another site cannot reach the server through a DNS name it controls
# (DNS rebinding) and read the answers, which quote the corpus.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
# Scripts and styles come from this server only: even injected markup could not run a script (defence in depth; the
# page never parses answer text as HTML in the first place).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

AnswerFn = Callable[[list[str], int], Sequence[Sequence[dict]]]


class RequestError(Exception):
    """A request the endpoint refuses: `status` and a message naming what was expected and what was received."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(
    answer_fn: AnswerFn,
    *,
    model_name: str = "",
    examples: Sequence[str] = (),
    max_questions: int = 64,
    max_top_k: int = 20,
    max_question_chars: int = 2000,
    allowed_hosts: Sequence[str] | None = LOOPBACK_HOSTS,
) -> Starlette:
    r"""
    Builds the web app over `answer_fn`.

    Args:
        answer_fn (`Callable[[list[str], int], list[list[dict]]]`): `answer_fn(questions, top_k)` returns, for each
            question in order, its answers best first, as JSON-serializable dicts; the page reads `answer`, `score`,
            `start`, `end` (character offsets of the answer in `evidence`), `evidence`, `title`, `block_id`, `rank`
            and `abstained` (optional). Calls are serialized: a model runs one batch at a time.
        model_name (`str`, *optional*): shown on the page.
        examples (`list[str]`, *optional*): sample questions the page offers.
        max_questions (`int`, defaults to 64): the most questions one request may ask.
        max_top_k (`int`, defaults to 20): the largest `top_k` a request may ask for.
        max_question_chars (`int`, defaults to 2000): the longest question accepted, in characters.
        allowed_hosts (`list[str]` or `None`, defaults to `LOOPBACK_HOSTS`): the `Host` headers accepted (`None`:
            any). Keep the default when serving on 127.0.0.1; a server on another interface needs its own names.
    """
    limits = {"max_questions": max_questions, "max_top_k": max_top_k, "max_question_chars": max_question_chars}
    info = {"model": model_name, "examples": list(examples), **limits}
    lock = threading.Lock()

    def answer_locked(questions: list[str], top_k: int) -> list[list[dict]]:
        with lock:
            return [list(answers) for answers in answer_fn(questions, top_k)]

    async def index(request: Request) -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers=SECURITY_HEADERS)

    async def api_info(request: Request) -> JSONResponse:
        return JSONResponse(info)

    async def api_ask(request: Request) -> JSONResponse:
        try:
            questions, top_k = parse_ask_request(await _read_json(request), **limits)
        except RequestError as error:
            return JSONResponse({"error": error.message}, status_code=error.status)
        try:
            answers = await run_in_threadpool(answer_locked, questions, top_k)
        except Exception as error:  # the questions were checked above: this is the model's failure, not the request's
            logger.exception("answering %d question(s) failed", len(questions))
            return JSONResponse({"error": f"the model failed: {type(error).__name__}: {error}"}, status_code=500)
        if len(answers) != len(questions):
            logger.error("the answer function returned %d lists for %d questions", len(answers), len(questions))
            return JSONResponse(
                {"error": f"the model returned {len(answers)} answer lists for {len(questions)} questions"},
                status_code=500,
            )
        return JSONResponse(
            [{"question": question, "answers": found} for question, found in zip(questions, answers, strict=True)]
        )

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/api/info", api_info, methods=["GET"]),
        Route("/api/ask", api_ask, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    middleware = [] if allowed_hosts is None else [Middleware(_AllowedHosts, hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware, exception_handlers={404: _json_error, 405: _json_error})


class _AllowedHosts:
    """Refuses a request whose `Host` header (port aside) is none of `hosts`, with a 400 and `{"error": ...}` naming
    what is accepted, like every other refusal of the API (Starlette's own middleware answers in plain text)."""

    def __init__(self, app, hosts: list[str]):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # "[::1]" has colons of its own
            if name not in self.hosts:
                accepted = " or ".join(self.hosts)
                message = (f"Host {host!r} is not accepted: this server answers requests addressed to {accepted} "
                           "(`realm-hf serve --host 0.0.0.0` serves requests from other machines)")  # fmt: skip
                await JSONResponse({"error": message}, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _json_error(request: Request, error) -> JSONResponse:
    """404 and 405 as JSON, like every other answer of the API: `{"error": ...}`."""
    allowed = {404: "GET /, GET /api/info, POST /api/ask", 405: "GET /api/info, POST /api/ask"}[error.status_code]
    message = f"{request.method} {request.url.path}: {error.detail}; expected {allowed}"
    return JSONResponse({"error": message}, status_code=error.status_code, headers=getattr(error, "headers", None))


MAX_BODY_BYTES = 1 << 20


async def _read_json(request: Request):
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        # Also what keeps other sites' pages from posting here without a CORS preflight, which this app never grants.
        raise RequestError(
            415, f"expected a JSON body (Content-Type: application/json), got {content_type or 'none'!r}."
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"expected a body of at most {MAX_BODY_BYTES} bytes.")
    try:
        return json.loads(body)
    except ValueError as error:
        raise RequestError(400, f"expected a JSON body, got invalid JSON: {error}.") from None


def parse_ask_request(payload, max_questions: int, max_top_k: int, max_question_chars: int) -> tuple[list[str], int]:
    """Checks a `POST /api/ask` body: returns `(questions, top_k)`, or raises `RequestError` (400) naming what was
    expected and what was received."""
    if not isinstance(payload, dict):
        raise RequestError(400, f'expected a JSON object {{"questions": [...], "top_k": n}}, got {_kind(payload)}.')
    unknown = sorted(set(payload) - {"questions", "top_k"})
    if unknown:
        raise RequestError(400, f"expected the keys 'questions' and 'top_k' (optional), got unknown keys {unknown}.")
    questions = payload.get("questions")
    if not isinstance(questions, list) or not questions:
        raise RequestError(400, f"expected 'questions' to be a non-empty list of strings, got {_kind(questions)}.")
    if len(questions) > max_questions:
        raise RequestError(400, f"expected at most {max_questions} questions per request, got {len(questions)}.")
    for index, question in enumerate(questions):
        if not isinstance(question, str):
            raise RequestError(400, f"expected questions[{index}] to be a string, got {_kind(question)}.")
        which = "the question" if len(questions) == 1 else f"questions[{index}]"
        if not question.strip():
            raise RequestError(400, f"{which} is empty: type a question.")
        problem = question_problem(question)  # the pipeline's own check: lone surrogates, punctuation only
        if problem is not None:
            raise RequestError(400, f"{which}: {problem}")
        if len(question) > max_question_chars:
            raise RequestError(
                400,
                f"expected questions of at most {max_question_chars} characters, questions[{index}] has "
                f"{len(question)}.",
            )
    top_k = payload.get("top_k", 1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_top_k:
        raise RequestError(400, f"expected 'top_k' to be an integer from 1 to {max_top_k}, got {top_k!r}.")
    return [question.strip() for question in questions], top_k


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


def _kind(value) -> str:
    """A JSON value as a message shows it: its JSON type and (the start of) its text."""
    if value is None:
        return "null"
    text = json.dumps(value, ensure_ascii=False)
    return f"{_JSON_TYPES.get(type(value), type(value).__name__)} {text if len(text) <= 60 else text[:57] + '...'}"


__all__ = ["LOOPBACK_HOSTS", "RequestError", "create_app", "parse_ask_request"]
