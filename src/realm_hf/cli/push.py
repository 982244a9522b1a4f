"""`realm-hf push DIR REPO_ID`: upload a saved REALM checkpoint (and an index) to the Hub in one commit."""

import argparse

HELP = """\
Uploads DIR, as written by save_pretrained (model, tokenizer, block records of the retriever), to the Hub repo REPO_ID
in one commit, creating the repo if needed. An index DIR holds (or --index) goes up too, under index/. The README.md
is DIR's own when it has one; otherwise a model card is generated (library_name realm_hf, usage for the model's class).

  realm-hf push ./my-realm me/my-realm
  realm-hf push ./my-realm me/my-realm --index ./my-index --private

Authentication: `hf auth login` or HF_TOKEN, or --token. HF_ENDPOINT selects another Hub.
"""


# Where huggingface_hub's transport errors come from (it has used requests, httpx and a vendored httpx2).
NETWORK_LIBRARIES = frozenset({"httpx", "httpx2", "httpcore", "requests", "urllib3"})


def cmd_push(args) -> int:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from realm_hf.errors import UsageError
    from realm_hf.hub import DEFAULT_COMMIT_MESSAGE, push_to_hub

    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        raise UsageError(f"REPO_ID {args.repo_id!r}: expected 'name' or 'namespace/name' ({error})") from None

    # push_to_hub checks DIR and --index (complete, finished, of the model's dimension and its documents' count) before
    # anything is sent; what it finds is named as --index, exit code 1 as for a bad DIR
    try:
        commit = push_to_hub(
            args.directory,
            args.repo_id,
            index_dir=args.index,
            token=args.token,
            private=True if args.private else None,
            revision=args.revision,
            commit_message=args.message or DEFAULT_COMMIT_MESSAGE,
            base_model=args.base_model,
            license=args.license,
            index_option="--index",
        )
    except Exception as error:
        refused = _refusal(error, args)
        if refused is not None:
            raise refused from error
        if any(kind.__module__.split(".")[0] in NETWORK_LIBRARIES for kind in type(error).__mro__):
            # realm-hf's one handler prints it as `realm-hf push: error: ...` (exit 1), not as a bug to report
            raise ConnectionError(f"could not reach the Hub to push {args.directory} ({type(error).__name__}: "
                                  f"{error}); check the network and your token (HF_TOKEN or `hf auth login`)") from error  # fmt: skip
        raise
    print(f"pushed {args.directory} to {args.repo_id} in one commit: {commit.commit_url}")
    return 0


def _refusal(error: Exception, args) -> OSError | None:
    """The Hub answered but would not take the push (HTTP 401: no token, or not a valid one; 403: the token may not
    write there), or offline mode is on: said as such, not as a Hub that could not be reached. `None` otherwise."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    login = "log in with `hf auth login`, set HF_TOKEN or pass --token"
    if status == 401:
        return PermissionError(f"the Hub refused to push {args.directory} to {args.repo_id} (HTTP 401): no token was "
                               f"found, or it is not valid; {login}")  # fmt: skip
    if status == 403:
        return PermissionError(f"the Hub refused to push {args.directory} to {args.repo_id} (HTTP 403): the token may "
                               f"not write to {args.repo_id}; use a token with write access to it ({login})")  # fmt: skip
    if type(error).__name__ == "OfflineModeIsEnabled":
        return ConnectionError(f"HF_HUB_OFFLINE is set: pushing {args.directory} needs the Hub; unset HF_HUB_OFFLINE "
                               "for this command")  # fmt: skip
    return None


def add_parser(subparsers) -> None:
    push = subparsers.add_parser(
        "push",
        help="upload a model directory (and an index) to the Hub in one commit",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    push.add_argument("directory", metavar="DIR", help="directory written by save_pretrained (model + tokenizer)")
    push.add_argument("repo_id", metavar="REPO_ID", help="Hub repo, e.g. me/my-realm (created if missing)")
    push.add_argument(
        "--index", metavar="DIR", help="an index directory (realm-hf index build) to upload under index/"
    )
    push.add_argument("--private", action="store_true", help="create the repo private (an existing repo is unchanged)")
    push.add_argument("--token", help="Hub token (default: the saved login or HF_TOKEN)")
    push.add_argument("--revision", help="branch to commit to (created if missing; default: main)")
    push.add_argument("--message", help='commit message (default: "Upload REALM checkpoint with realm_hf")')
    push.add_argument("--base-model", help="for a generated card: the Hub repo the model was trained from")
    push.add_argument("--license", help="for a generated card: a Hub license id, e.g. apache-2.0")
    push.set_defaults(func=cmd_push)


__all__ = ["add_parser"]
