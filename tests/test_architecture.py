"""The layout tells the architecture: modeling code imports nothing from the rest of the package and does no I/O."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "realm_hf"


def _imports(path: Path, allowed_lazy: set[tuple[str, str]] = frozenset()) -> set[str]:
    """Every module `path` imports, except the (function, module) pairs of `allowed_lazy` imported in a function's
    try block."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for block in (node for node in ast.walk(function) if isinstance(node, ast.Try)):
                for node in (node for statement in block.body for node in ast.walk(statement)):
                    if isinstance(node, ast.ImportFrom) and (function.name, node.module) in allowed_lazy:
                        skipped.add(id(node))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            prefix = "." * node.level + (node.module or "")
            names.add(prefix)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


# The one exception: `RealmPreTrainedModel.push_to_hub` imports the card and upload code when a push happens, inside
# the method and a try block (so Transformers' remote-code import check skips it), rather than holding it in modeling.
LAZY_PACKAGE_IMPORTS = {"modeling_realm.py": {("push_to_hub", "realm_hf.hub")}}


def test_modeling_imports_only_itself_and_libraries():
    for path in (PACKAGE / "modeling").glob("*.py"):
        for name in _imports(path, LAZY_PACKAGE_IMPORTS.get(path.name, set())):
            assert not name.startswith(".."), f"{path.name} imports {name}: modeling must not depend on the package"
            assert not name.startswith("realm_hf"), f"{path.name} imports {name}"


def test_modeling_does_no_file_or_network_io():
    forbidden = {"huggingface_hub", "numpy", "requests", "os", "pathlib", "pickle"}
    for path in (PACKAGE / "modeling").glob("modeling_*.py"):
        assert not (_imports(path) & forbidden), f"{path.name} imports {_imports(path) & forbidden}"


def test_retrieval_does_not_import_training_or_pipelines():
    for path in (PACKAGE / "retrieval").glob("*.py"):
        for name in _imports(path):
            assert not any(part in name for part in ("training", "pipelines", "cli")), f"{path.name} imports {name}"


def test_serving_does_not_import_the_cli_or_training():
    for path in (PACKAGE / "serving").glob("*.py"):
        for name in _imports(path):
            assert not any(part in name for part in ("training", "cli")), f"{path.name} imports {name}"
