"""Every console script (setup.py's entry points) and the TVsub preparation
module turn bad input into one line, ``TOOL: error: ...``, and a non-zero
exit, never a traceback (issue 26): one bad input each, run in-process."""

import importlib
import re
import sys

import pytest

#: tool, its function (module:function, called with argv), argv ({tmp}: the test's
#: directory, {bad}: a file that is no fairseq-generate output), a part of the message
CASES = [
    ("ctx-make-toy", "ctx_fairseq.cli.make_toy:cli_main",
     ["--out", "{tmp}/toy", "--docs", "0"], "--docs must be an integer >= 1"),
    ("ctx-demo", "ctx_fairseq.cli.demo:cli_main",
     ["--workdir", "{tmp}/demo", "--archs", "nosucharch"], "unknown architecture"),
    ("ctx-bench", "ctx_fairseq.cli.bench:cli_main",
     ["--archs", "nosucharch"], "unknown architecture 'nosucharch'"),
    ("ctx-score-contrastive", "ctx_fairseq.eval.scoring.contrastive:cli_main",
     ["--path", "{tmp}/nope.pt", "--data", "{tmp}", "--contrastive", "{tmp}/nope.jsonl"],
     "nope.jsonl: no such file"),
    ("ctx-prep-docs", "ctx_fairseq.prep.docs:cli_main",
     ["docids", "--src-lang", "zh", "--tgt-lang", "en", "--out-prefix", "{tmp}/p",
      "--src", "{bad}", "--tgt", "{tmp}/nope.txt", "--docids", "{tmp}/one.docids"],
     "nope.txt: cannot read"),
    ("ctx-dc-jsd", "ctx_fairseq.eval.analyses.dc_jsd:cli_main",
     ["{tmp}", "--path", "{tmp}/nope.pt"], "no such checkpoint"),
    ("ctx-bleu-by-length", "ctx_fairseq.eval.scoring.bleu_by_length:cli_main",
     ["--system", "a={tmp}/nope.txt"], "no such file"),
    ("ctx-dc-params", "ctx_fairseq.models.transformer_dc:params_cli_main",
     ["--vocab-size", "-5"], "--vocab-size must be larger"),
    ("ctx-hybrid-gates", "ctx_fairseq.eval.analyses.hybrid_gates:cli_main",
     ["{tmp}", "--path", "{tmp}/nope.pt"], "no such checkpoint"),
    ("ctx-context-aware-analysis", "ctx_fairseq.eval.analyses.context_aware_analysis:cli_main",
     ["bleu", "--path", "{tmp}/nope.pt", "--data", "{tmp}"], "nope.pt"),
    ("ctx-iterative-decode", "ctx_fairseq.cli.iterative_decode:cli_main",
     ["{tmp}", "--path", "{tmp}/nope.pt", "--out-dir", "{tmp}/it"], "test.docids"),
    ("ctx-selective-analysis", "ctx_fairseq.eval.analyses.selective_analysis:cli_main",
     ["sentence", "--path", "{tmp}/nope.pt", "--data", "{tmp}", "--line", "0"],
     "no such checkpoint"),
    ("ctx-doc-bleu", "ctx_fairseq.eval.scoring.doc_bleu:cli_main",
     ["{bad}", "--docids", "{tmp}/one.docids"], "no hypotheses (H- lines)"),
    ("ctx-probe", "ctx_fairseq.eval.analyses.probe:cli_main",
     ["run", "--path", "{tmp}/nope.pt", "--data", "{tmp}", "--task-file", "{tmp}/nope"],
     "no such file or directory"),
    ("ctx-prep-corpora", "ctx_fairseq.prep.corpora:cli_main",
     ["postprocess-generate", "--out", "{tmp}/pp.txt", "--lang", "en", "{bad}"],
     "no H- lines"),
    ("ctx-make-pronoun-suite", "ctx_fairseq.eval.scoring.make_pronoun_suite:cli_main",
     ["--src", "{bad}", "--tgt", "{tmp}/nope.txt", "--docids", "{tmp}/one.docids",
      "--out", "{tmp}/s.jsonl"], "cannot read"),
    ("ctx-cxmi", "ctx_fairseq.eval.context_use.cxmi:cli_main",
     ["--path", "{tmp}/nope.pt", "--data", "{tmp}", "--out", "{tmp}/cx"], "no such checkpoint"),
    ("ctx-generative-accuracy", "ctx_fairseq.eval.scoring.generative_accuracy:cli_main",
     ["--contrastive", "{tmp}/nope.jsonl", "--generate-output", "{bad}"], "no such file"),
    ("ctx-dp-eval", "ctx_fairseq.eval.pronouns.dp_eval:cli_main",
     ["--source", "{bad}", "--dp-source", "{tmp}/nope.zh", "--refs", "{bad}", "--hyp", "{bad}",
      "--json", "{tmp}/dp.json"], "nope.zh: cannot read"),
    ("ctx-dp-suite", "ctx_fairseq.eval.pronouns.dp_suite:cli_main",
     ["build", "--source", "{bad}", "--dp-source", "{tmp}/nope.zh", "--refs", "{bad}",
      "--out", "{tmp}/s.jsonl"], "nope.zh: cannot read"),
    ("ctx-doc2doc-split", "ctx_fairseq.cli.doc2doc_split:cli_main",
     ["{bad}", "--data", "{tmp}", "--split", "test", "--source-lang", "a", "--target-lang", "b",
      "--output", "{tmp}/o.txt"], "test.a-b.a.idx: not found"),
    # the issue's own example: a fairseq-generate file without S-/T-/H- lines
    ("prep_tvsub", "ctx_fairseq.prep.tvsub:main",
     ["score", "{bad}", "--refs", "{bad}", "--docids", "{tmp}/one.docids", "--out-dir",
      "{tmp}/tv"], "no hypotheses (H- lines)"),
]


def test_every_console_script_has_a_case():
    import os

    setup = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "setup.py")).read()
    scripts = set(re.findall(r'"(ctx-[a-z-]+) = ', setup))
    assert scripts and scripts <= {c[0] for c in CASES}


@pytest.mark.parametrize("tool,target,argv,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(tool, target, argv, expect, tmp_path, monkeypatch, capsys):
    (tmp_path / "notgen.txt").write_text("hello world\n")
    (tmp_path / "one.docids").write_text("d1\n")
    monkeypatch.setattr(sys, "argv", [tool])
    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    args = [a.format(tmp=tmp_path, bad=tmp_path / "notgen.txt") for a in argv]
    with pytest.raises(SystemExit) as exc:
        fn(args)
    code = exc.value.code
    assert code not in (0, None)
    # argparse prints its message; SystemExit("...") is printed by the interpreter
    err = capsys.readouterr().err + (code if isinstance(code, str) else "")
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "Traceback" not in err
    assert re.match(rf"{re.escape(tool)}( \w+)?: error: ", lines[-1]), lines[-1]
    assert expect in lines[-1]
