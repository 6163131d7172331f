"""The layers of ctx_fairseq (docs/architecture.md, issue 26): the runtime
data (``ctx_fairseq/data``) is the ground floor and imports nothing above it,
and corpus preparation (``ctx_fairseq/prep``) stays out of it."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ctx_fairseq")

#: what each ground-floor part may import of ctx_fairseq (every other part is above)
ALLOWED = {
    "data": ("ctx_fairseq.data", "ctx_fairseq.digest", "ctx_fairseq.errors"),
    "digest.py": (),
    "errors.py": (),
}


def ctx_imports(source: str, filename: str = "<source>"):
    """``(line, module)`` of every import of ctx_fairseq in ``source``, at any
    depth (an import inside a function counts as much as one at the top);
    relative imports are refused (the package imports itself by name)."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "ctx_fairseq"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append((node.lineno, "." * node.level + (node.module or "")))
            elif (node.module or "").split(".")[0] == "ctx_fairseq":
                if node.module == "ctx_fairseq":  # from ctx_fairseq import X: X is the part
                    out += [(node.lineno, f"ctx_fairseq.{a.name}") for a in node.names]
                else:
                    out.append((node.lineno, node.module))
    return out


def violations(part: str, allowed):
    path = os.path.join(ROOT, part)
    files = [path] if path.endswith(".py") else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py"))
    bad = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line, mod in ctx_imports(fh.read(), f):
                if not any(mod == a or mod.startswith(a + ".") for a in allowed):
                    bad.append(f"{os.path.relpath(f, ROOT)}:{line}: imports {mod}")
    return bad


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_the_ground_floor_imports_nothing_above_it(part):
    assert violations(part, ALLOWED[part]) == []


def test_the_check_sees_every_kind_of_import():
    src = ("import os\nfrom ctx_fairseq.data.docids import read_docids\n"
           "def f():\n    from ctx_fairseq.modules.sentence_cache import row_keys\n"
           "import ctx_fairseq.eval.cxmi as c\nfrom ctx_fairseq import prep\nfrom . import x\n")
    assert ctx_imports(src) == [(2, "ctx_fairseq.data.docids"), (5, "ctx_fairseq.eval.cxmi"),
                                (6, "ctx_fairseq.prep"), (7, "."),
                                (4, "ctx_fairseq.modules.sentence_cache")]
    mods = [m for _, m in ctx_imports(src)]
    assert [m for m in mods if not m.startswith("ctx_fairseq.data")] == [
        "ctx_fairseq.eval.cxmi", "ctx_fairseq.prep", ".", "ctx_fairseq.modules.sentence_cache"]


def test_corpus_preparation_is_not_in_the_runtime_data():
    names = os.listdir(os.path.join(ROOT, "data"))
    assert not [n for n in names if n.startswith("prep")], names
    assert {"docs.py", "corpora.py", "tvsub.py"} <= set(os.listdir(os.path.join(ROOT, "prep")))
