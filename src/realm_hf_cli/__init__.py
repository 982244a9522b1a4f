"""The `realm-hf` console entry point: answers `--help` and usage errors before torch or Transformers load.

`import realm_hf` registers the REALM classes with Transformers' Auto classes and the "open-qa" pipeline (its
documented contract), so it imports torch and Transformers: seconds. A console script naming `realm_hf.cli.main:main`
pays that before argparse even runs. This entry point instead places the `realm_hf` package in `sys.modules` without
running its `__init__.py`, so that `realm_hf.cli` (whose parsers import nothing heavy) can parse the command line;
`realm_hf.cli.main.main` runs the package's `__init__.py` just before a command runs, so every command sees the
package exactly as after `import realm_hf`. `python -m realm_hf.cli` still works, with the eager import.
"""

import importlib.util
import sys


def main(argv: list[str] | None = None) -> int:
    if "realm_hf" not in sys.modules:
        spec = importlib.util.find_spec("realm_hf")
        package = importlib.util.module_from_spec(spec)  # __path__ and __spec__ set, __init__.py not run yet
        package.__realm_hf_deferred_init__ = True
        sys.modules["realm_hf"] = package
    from realm_hf.cli.main import main as run

    return run(argv)


__all__ = ["main"]
