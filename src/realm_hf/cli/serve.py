"""`realm-hf serve`: a local web page and a JSON endpoint that answer questions with highlighted evidence."""

import argparse
import errno
import ipaddress
import re
import socket
import sys

from .arguments import loading_model, model_location, positive_int, without_weight_loading_bar

HELP = """\
Serves a web page to ask questions and see each answer highlighted in the passage it was read from (with its title,
score and, when the model gives it, a low-confidence flag), and a JSON endpoint:

  curl -s http://127.0.0.1:8000/api/ask -H 'Content-Type: application/json' \\
       -d '{"questions": ["What is the capital of Kenya?"], "top_k": 3}'

  realm-hf serve                              # the default model (realm-minilm-factbook), http://127.0.0.1:8000
  realm-hf serve --model ./my-realm --port 8080
  realm-hf serve --model ./my-realm --index ./my-index

Needs the "serve" extra: pip install 'realm_hf[serve]'. The server binds to 127.0.0.1 (this machine only) unless
--host says otherwise; it has no authentication, so only bind to another interface on a network you trust.
"""
EXTRA_MODULES = ("starlette", "uvicorn")


def missing_serve_modules() -> list[str]:
    """The modules of the "serve" extra that are not installed."""
    from importlib.util import find_spec

    return [name for name in EXTRA_MODULES if find_spec(name) is None]


def load_open_qa_model(name_or_path: str, index: str | None = None):
    """`(model, retriever)` for `name_or_path`, with the index at `index` when given: the one place `serve` loads."""
    from realm_hf.loading import load_open_qa

    with without_weight_loading_bar():
        return load_open_qa(name_or_path, index=index)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port_in_use(host: str, port: int) -> OSError | None:
    """The error binding `host:port` gives now, if any: checked before the minutes-long model load, not after."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error
    return None


HOST_EXPECTED = (
    "expected an address of this machine, such as 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces)"
)


def _listen_error(host: str, port: int, error: OSError) -> str:
    """What binding `host:port` failed with, in one line naming the option at fault: --host for an address that is not
    an IP address, a host name this machine resolves or one of its own addresses; --port otherwise (busy, reserved)."""
    reason = error.strerror or str(error)
    if isinstance(error, socket.gaierror):  # not an IP address, and no host name this machine can resolve
        what = "a valid IP address" if re.fullmatch(r"[\d.]+", host) else "an IP address or a host name that resolves"
        return f"--host {host!r} is not {what} ({reason}); {HOST_EXPECTED}"
    if error.errno == errno.EADDRNOTAVAIL:  # a valid address, but another machine's
        return f"--host {host!r} is not an address of this machine ({reason}); {HOST_EXPECTED}"
    return f"cannot listen on {host}:{port}: {reason}. Pass another --port (or --host)."


def cmd_serve(args) -> int:
    missing = missing_serve_modules()
    if missing:
        print(f"realm-hf serve: error: needs the 'serve' extra ({', '.join(missing)} not installed): "
              "pip install 'realm_hf[serve]'", file=sys.stderr)  # fmt: skip
        return 1
    error = _port_in_use(args.host, args.port)
    if error is not None:
        print(f"realm-hf serve: error: {_listen_error(args.host, args.port, error)}", file=sys.stderr)
        return 1
    model_path, model_name, examples = args.model, args.model, []
    if model_path is None:
        from realm_hf.default_model import DEFAULT_MODEL_NAME, DEFAULT_QUESTIONS, default_model_dir

        default = default_model_dir()
        if default is None:
            print("realm-hf serve: error: no --model given and the default model (realm-minilm-factbook) is not in this "
                  "installation: pass --model DIR or a Hub repo id.", file=sys.stderr)  # fmt: skip
            return 1
        model_path, model_name, examples = str(default), f"{DEFAULT_MODEL_NAME} (the default model)", DEFAULT_QUESTIONS
    model_path = model_location(model_path)
    if args.index is not None:
        from realm_hf.loading import check_index, is_own_index

        from .index import index_note

        given, found = args.index, check_index(args.index, "--index")  # named before the model loads, not after
        args.index = str(found)
        own = is_own_index(model_path, found)
        note = index_note(given, own, found)
        if note:
            print(note, file=sys.stderr)
        if not own:
            examples = []  # the default model's sample questions are about its own corpus, not yours
    print(f"loading {model_path}{f' with the index {args.index}' if args.index else ''} ...", file=sys.stderr)
    with loading_model(model_path):
        model, retriever = load_open_qa_model(model_path, args.index)

    import uvicorn

    from realm_hf.serving import LOOPBACK_HOSTS, PipelineAnswerer, create_app

    loopback = _is_loopback(args.host)
    app = create_app(
        PipelineAnswerer.from_model(model, retriever, batch_size=args.batch_size),
        model_name=model_name if args.index is None else f"{model_name}, index {args.index}",
        examples=examples,
        allowed_hosts=LOOPBACK_HOSTS if loopback else None,
    )
    if not loopback:
        warning = (
            f"WARNING: listening on {args.host}, not 127.0.0.1: anyone who can reach this machine on port {args.port} "
            "can ask questions and read the corpus. There is no authentication."
        )
        print(warning, file=sys.stderr)
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving on http://{shown_host}:{args.port}  (Ctrl+C to stop)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {value!r}")
    return port


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="a local web page and JSON endpoint: ask questions, see answers highlighted in their evidence",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--model", help="directory or Hub repo id of a RealmForOpenQA model with its retriever files "
                                       "(default: the default model, realm-minilm-factbook)")  # fmt: skip
    serve.add_argument("--index", metavar="DIR", help="an index directory (realm-hf index build) to retrieve from")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1, this machine "
                                                           "only)")  # fmt: skip
    serve.add_argument("--port", type=_port, default=8000, help="port to listen on (default: 8000)")
    serve.add_argument(
        "--batch-size", type=positive_int, default=8, help="questions answered per forward pass (default: 8)"
    )
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level (default: info: one line per request)")  # fmt: skip
    serve.set_defaults(func=cmd_serve)
