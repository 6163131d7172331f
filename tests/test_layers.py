"""The layers of ctx_fairseq (docs/architecture.md, issues 26 and 35): every
part imports only the floors below it (the table ``FLOORS``, the one
docs/architecture.md draws), no module takes part in an import circle
(``TYPE_CHECKING`` and function-level imports included), and corpus
preparation (``ctx_fairseq/prep``) stays out of the runtime data."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ctx_fairseq")

#: what each part may import of ctx_fairseq, bottom up (a part imports itself too)
_GROUND = ("ctx_fairseq.errors",)
FLOORS = {
    "digest.py": (),
    "errors.py": (),
    "generate_output.py": _GROUND,
    "flops.py": (),
    "host_reads.py": (),
    "safe_load.py": (),
    "compat.py": _GROUND,
    "_registry.py": (),
    "data": ("ctx_fairseq.data", "ctx_fairseq.digest") + _GROUND,
    "modules": ("ctx_fairseq.modules", "ctx_fairseq.data", "ctx_fairseq.digest") + _GROUND,
    "models": ("ctx_fairseq.models", "ctx_fairseq.modules", "ctx_fairseq.data") + _GROUND,
    "tasks": ("ctx_fairseq.tasks", "ctx_fairseq.data") + _GROUND,
    "criterions": ("ctx_fairseq.criterions", "ctx_fairseq.data") + _GROUND,
    # the optimizer's parameter groups (--lr-scale-pretrained): fairseq's trainer
    # and optimizers only
    "optim": ("ctx_fairseq.optim",) + _GROUND,
    "prep": ("ctx_fairseq.prep", "ctx_fairseq.data", "ctx_fairseq.generate_output") + _GROUND,
    # the analyses and tools: everything but the console layer (the package root
    # itself: the import that registers the plugin)
    "eval": ("ctx_fairseq.eval", "ctx_fairseq.prep", "ctx_fairseq.tasks",
             "ctx_fairseq.criterions", "ctx_fairseq.models", "ctx_fairseq.modules",
             "ctx_fairseq.data", "ctx_fairseq.digest", "ctx_fairseq.generate_output",
             "ctx_fairseq.safe_load", "ctx_fairseq.flops", "ctx_fairseq.host_reads",
             "ctx_fairseq.compat", "ctx_fairseq._registry") + _GROUND,
    "cli": ("ctx_fairseq",),
    "__init__.py": ("ctx_fairseq.compat", "ctx_fairseq.errors", "ctx_fairseq.safe_load",
                    "ctx_fairseq._registry", "ctx_fairseq.optim"),
}
#: the ground floor (issue 26's name for it)
ALLOWED = {k: FLOORS[k] for k in ("data", "digest.py", "errors.py")}
#: the package root, imported to register the plugin
ROOT_IMPORT = "ctx_fairseq"


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
    """``file:line: imports mod`` for every import of ``part`` outside ``allowed``."""
    path = os.path.join(ROOT, part)
    files = [path] if path.endswith(".py") else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py"))
    bad = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line, mod in ctx_imports(fh.read(), f):
                if mod == ROOT_IMPORT and part.split("/")[0] in ("eval", "cli"):
                    continue  # registers the plugin
                if not any(mod == a or mod.startswith(a + ".") for a in allowed):
                    bad.append(f"{os.path.relpath(f, ROOT)}:{line}: imports {mod}")
    return bad


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_the_ground_floor_imports_nothing_above_it(part):
    assert violations(part, ALLOWED[part]) == []


def test_the_check_sees_every_kind_of_import():
    src = ("import os\nfrom ctx_fairseq.data.docids import read_docids\n"
           "def f():\n    from ctx_fairseq.modules.sentence_cache import row_keys\n"
           "import ctx_fairseq.eval.context_use.cxmi as c\nfrom ctx_fairseq import prep\nfrom . import x\n")
    assert ctx_imports(src) == [(2, "ctx_fairseq.data.docids"), (5, "ctx_fairseq.eval.context_use.cxmi"),
                                (6, "ctx_fairseq.prep"), (7, "."),
                                (4, "ctx_fairseq.modules.sentence_cache")]
    mods = [m for _, m in ctx_imports(src)]
    assert [m for m in mods if not m.startswith("ctx_fairseq.data")] == [
        "ctx_fairseq.eval.context_use.cxmi", "ctx_fairseq.prep", ".", "ctx_fairseq.modules.sentence_cache"]


def test_corpus_preparation_is_not_in_the_runtime_data():
    names = os.listdir(os.path.join(ROOT, "data"))
    assert not [n for n in names if n.startswith("prep")], names
    assert {"docs.py", "corpora.py", "tvsub.py"} <= set(os.listdir(os.path.join(ROOT, "prep")))


def test_every_part_of_the_package_is_on_a_floor():
    parts = {n for n in os.listdir(ROOT) if n.endswith(".py") or (
        os.path.isdir(os.path.join(ROOT, n)) and not n.startswith("__"))}
    assert parts == set(FLOORS), parts ^ set(FLOORS)


@pytest.mark.parametrize("part", sorted(FLOORS))
def test_no_import_runs_back_up_the_floors(part):
    assert violations(part, FLOORS[part]) == []


def _module_graph():
    """Module name -> the ctx_fairseq modules it imports (at any depth)."""
    mods = {}
    for d, _, fs in os.walk(ROOT):
        for f in fs:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                mods[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    graph = {}
    for name, path in mods.items():
        with open(path, encoding="utf-8") as fh:
            targets = set()
            for _, mod in ctx_imports(fh.read(), path):
                while mod and mod not in mods:  # from pkg.mod import name
                    mod = mod.rsplit(".", 1)[0] if "." in mod else ""
                if mod and mod != name:
                    targets.add(mod)
        graph[name] = targets
    return graph


def circles(graph):
    """The import circles of ``graph`` (strongly connected parts of more than
    one module), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_is_in_an_import_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert circles(_module_graph()) == []


@pytest.mark.parametrize("group", ["eval/scoring", "eval/context_use"])
def test_general_scoring_imports_no_papers_analysis(group):
    """eval/ by role (docs/architecture.md): general scoring and context use
    import no analysis of eval/analyses/ (an analysis may import them)."""
    allowed = tuple(a for a in FLOORS["eval"] if a != "ctx_fairseq.eval") + (
        "ctx_fairseq.eval.scoring", "ctx_fairseq.eval.context_use",
        "ctx_fairseq.eval.checkpoints", "ctx_fairseq.eval.text_units",
        "ctx_fairseq.eval.report_files")
    assert violations(group, allowed) == []
