"""Console-script wrappers for ``cli_main`` functions that return a value.

The analysis CLIs return the paths they wrote (handy in Python and tests), but
a console script passes its function's return value to ``sys.exit``: a dict
would be printed and turn success into exit status 1. These wrappers run the
real function and return ``None``.
"""

import importlib


def _run(target: str) -> None:
    module, name = target.split(":")
    getattr(importlib.import_module(module), name)()


def dc_jsd() -> None:
    _run("ctx_fairseq.eval.analyses.dc_jsd:cli_main")


def bleu_by_length() -> None:
    _run("ctx_fairseq.eval.scoring.bleu_by_length:cli_main")


def hybrid_gates() -> None:
    _run("ctx_fairseq.eval.analyses.hybrid_gates:cli_main")


def context_aware_analysis() -> None:
    _run("ctx_fairseq.eval.analyses.context_aware_analysis:cli_main")


def score_contrastive() -> None:
    _run("ctx_fairseq.eval.scoring.contrastive:cli_main")


def cxmi() -> None:
    _run("ctx_fairseq.eval.context_use.cxmi:cli_main")


def generative_accuracy() -> None:
    _run("ctx_fairseq.eval.scoring.generative_accuracy:cli_main")
