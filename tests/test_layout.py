"""The package's layout is its architecture: the arrows between its parts run one way, and this test reads every
module's imports to keep it so.

  - the core (kvlesson/*.py) imports no sub-package, except `llama`, which joins the core, weights/ and serving/
    into the model a learner loads, and the package's __init__, which re-exports the public names;
  - a sub-package imports the core and the leaves, itself, and no other sub-package, except teaching/, which may
    import anything (it teaches all of it);
  - nothing outside teaching/ imports teaching/;
  - no module imports another one's private (underscored) names.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvlesson"
SUBPACKAGES = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
# what each sub-package may import beyond itself, the core and the leaves
# (parallel: its ranks load the model's weights themselves, and disaggregation ships serving's paged blocks, in lesson
# 11's 8-bit form too)
ALLOWED = {"weights": set(), "serving": set(), "shrink": set(), "costs": set(), "teaching": SUBPACKAGES,
           "parallel": {"weights", "serving", "shrink"}}


def imports(path):
    """The kvlesson modules a file imports, as dotted names after 'kvlesson.'."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvlesson":
            parts = node.module.split(".")[1:]
            found |= {".".join(parts + [a.name]) if not parts else ".".join(parts) for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("kvlesson.")}
    return found


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "data" not in p.parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_arrows_run_one_way(path):
    where = path.relative_to(PACKAGE).parts
    home = where[0] if len(where) > 1 else None  # the sub-package this module lives in, or None for the core
    for target in imports(path):
        sub = target.split(".")[0]
        if sub not in SUBPACKAGES or sub == home:
            continue
        if home is None and where[-1] == "__init__.py":  # the public names: any part but the teaching aids
            assert sub != "teaching", f"kvlesson/__init__.py imports kvlesson.{target}"
        elif home is None:
            assert where[-1] == "llama.py" and sub in ("weights", "serving"), \
                f"the core module {path.name} imports kvlesson.{target}"
        else:
            assert sub in ALLOWED[home], f"{home}/{path.name} imports kvlesson.{target}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_ones_private_names(path):
    """A name with a leading underscore is its module's own business: what another module needs is public."""
    private = [f"{node.module}.{a.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvlesson")
               for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, f"{path.relative_to(PACKAGE)} imports private names: {private}"
