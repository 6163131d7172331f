"""Every ``python -m ctx_fairseq...`` module path (and ``from ctx_fairseq...
import main``) that the recipes, scripts and docs run exists and answers
``--help`` (issue 35: module paths keep working or are updated everywhere)."""

import contextlib
import io
import os
import re
import runpy
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACES = ("recipes", "scripts", "docs", "examples", "README.md", "BENCHMARKS.md")
MODULE = re.compile(r"-m (ctx_fairseq(?:\.[a-z_]+)+)")
MAIN = re.compile(r"from (ctx_fairseq(?:\.[a-z_]+)+) import main")


def module_paths():
    """``{module: first place it is named}`` over the recipes, scripts and docs."""
    found = {}
    for place in PLACES:
        path = os.path.join(REPO, place)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
            if f.endswith((".sh", ".md", ".py")) and "study-" not in d]
        for f in sorted(files):
            with open(f, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    for m in MODULE.findall(line) + MAIN.findall(line):
                        found.setdefault(m, f"{os.path.relpath(f, REPO)}:{n}")
    return found


def test_the_recipes_and_docs_name_module_paths():
    found = module_paths()
    assert {"ctx_fairseq.prep.tvsub", "ctx_fairseq.eval.scoring.recipe_report"} <= set(found), found


@pytest.mark.parametrize("module", sorted(module_paths()))
def test_each_module_path_answers_help(module, monkeypatch):
    where = module_paths()[module]
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    assert exit_.value.code in (0, None), f"{module} (named at {where}): exit {exit_.value.code}"
    assert "usage" in out.getvalue().lower(), f"{module} (named at {where}) printed no usage"
