"""Issue 39's recipe rows (recipes/lib/steps_doc2doc.sh): doc2doc greedy,
multi-resolution doc2doc and G-Transformer fine-tuned from the sentence model,
generated with the sentence-count frame, split back into sentences
(ctx-doc2doc-split) and scored with s-BLEU, d-BLEU per document and per
segment (ctx-doc-bleu --segments), the pronoun suites and the paired tests,
next to the transformer and concatenation rows:

* the TVsub recipe's smoke mode on tiny synthetic episodes (with a +DP source:
  the dropped-pronoun steps too), a re-run skipping every step;
* the Maruf et al. pipeline through the IWSLT17 TED recipe's smoke mode (needs
  the XML sets: ``$IWSLT17_TED_DIR`` or ``../shared/data/iwslt17-ted-en-de``);
* the TED recipe's split of the XML sets when there is no training set
  (dev2010, tst2010-tst2014 for training, tst2015 for test), data steps only;
* the shell spec of the rows and the table script on fabricated results.
"""

import json
import os
import re
import subprocess

import pytest

from test_recipe_tvsub import write_tvsub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TVSUB = os.path.join(REPO, "recipes", "tvsub_zh_en", "run.sh")
TED = os.path.join(REPO, "recipes", "iwslt17_ted_en_de", "run.sh")
LIB = os.path.join(REPO, "recipes", "lib")
DATA = os.environ.get("IWSLT17_TED_DIR") or os.path.normpath(
    os.path.join(REPO, "..", "shared", "data", "iwslt17-ted-en-de"))
needs_ted = pytest.mark.skipif(
    not os.path.isfile(os.path.join(DATA, "IWSLT17.TED.tst2015.en-de.en.xml")),
    reason=f"IWSLT17 TED en-de XML files not found in {DATA} (set IWSLT17_TED_DIR)")
D2D = ("doc2doc", "doc2doc_mr", "gtrans")


def _run(recipe, args, env=None, timeout=2400):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(["bash", recipe, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def _bash(script):
    return subprocess.run(["bash", "-c", f'set -euo pipefail; RECIPE_NAME=t; . "{LIB}/recipe.sh"; '
                           + script], capture_output=True, text=True, cwd=REPO)


def _hyp_ids(path):
    return sorted(int(line.split("\t")[0][2:]) for line in open(path, encoding="utf-8")
                  if line.startswith("H-"))


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_the_rows_options():
    r = _bash('for m in doc2doc doc2doc_mr gtrans; do d2d_spec "$m" 256; '
              'echo "$m|$D2D_ARCH|${D2D_TASK[*]}|${D2D_MODEL[*]}|${D2D_GEN[*]}"; done; '
              'd2d_any transformer concat && echo any1; d2d_any transformer gtrans && echo any2')
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    task = "--task document_translation --doc2doc {} --doc2doc-max-tokens 256 --source-context-size 0"
    assert out[0] == f"doc2doc|transformer|{task.format('greedy')}||--doc2doc-frame"
    assert out[1] == f"doc2doc_mr|transformer|{task.format('multires')}||--doc2doc-frame"
    assert out[2] == (f"gtrans|transformer_gtrans|{task.format('greedy')}|--gtrans-global-layers 2 "
                      "--word-dropout 0.1 --lr-scale-pretrained 0.2|--doc2doc-frame")
    assert out[3:] == ["any2"]
    bad = _bash("d2d_spec doc2doc 0")
    assert bad.returncode != 0 and "D2D_MAX_TOKENS=0" in bad.stderr


def test_the_table_reads_every_result(tmp_path):
    res = tmp_path / "results"

    def bleu(s, d, seg=None):
        out = {"sentence_level": {"bleu": s, "signature": "sig-s"},
               "document_level": {"bleu": d, "signature": "sig-d"}}
        if seg is not None:
            out["segment_level"] = {"bleu": seg, "segments": 7}
        return out
    for m, s in (("sentence", 10.0), ("gtrans", 12.0)):
        d = res / m
        d.mkdir(parents=True)
        for k in ("tokenized_bleu", "sacrebleu"):
            (d / f"{k}.json").write_text(json.dumps(bleu(s, s + 1)))
            (d / f"{k}_segments.json").write_text(json.dumps(bleu(s, s + 1, s + 0.5)))
        (d / "contrastive_pronouns.json").write_text(json.dumps(
            {"overall": {"accuracy": 0.5, "correct": 5, "n": 10, "ties": 0}}))
    (res / "gtrans" / "paired.json").write_text(json.dumps(
        {"sentences": {"p_value": 0.0004, "delta": 2.0}, "documents": None}))
    (res / "gtrans" / "paired_segments.json").write_text(json.dumps(
        {"sentences": {"p_value": 0.0004, "delta": 2.0}, "documents": None,
         "segments": {"p_value": 0.0312, "delta": 1.5, "segments": 7}}))
    (res / "gtrans" / "doc2doc_split.json").write_text(json.dumps(
        {"segments": 7, "mismatched_segments": 0, "doc2doc_max_tokens": 128}))
    md = subprocess.run(["python", os.path.join(LIB, "doc2doc_table.py"), "md", str(res),
                         "sentence=transformer", "gtrans=G"], capture_output=True, text=True)
    assert md.returncode == 0, md.stderr
    assert ("| sentence | transformer | 10.00 | 11.00 | 10.50 | 10.00 | 11.00 | 10.50 "
            "| 50.0 (5/10) | - | - |") in md.stdout, md.stdout
    assert "| gtrans | G | 12.00 | 13.00 | 12.50 | 12.00 | 13.00 | 12.50 | 50.0 (5/10) " \
        "| <0.001 / n/a / 0.031 | 7 (0) |" in md.stdout, md.stdout
    assert "(7 segments" in md.stdout


def _check_d2d_outputs(work, name, docids, seg_map):
    """A doc2doc row's per-sentence output: every sentence id once, its segment
    map the shared one, no mismatched segment."""
    n = _lines(docids)
    assert _hyp_ids(work / "generate" / f"{name}.txt") == list(range(n)), name
    assert (work / "generate" / f"{name}.txt.segments").read_text() == seg_map.read_text()
    split = json.loads((work / "results" / name / "doc2doc_split.json").read_text())
    assert split["mismatched_segments"] == 0 and split["sentences"] == n, split


@pytest.mark.slow
def test_tvsub_doc2doc_rows_end_to_end(tmp_path):
    """TVsub smoke (tiny episodes, 3 references, a +DP source, an equal
    target-token budget): transformer, concat and the three doc2doc rows in one table with s-BLEU, d-BLEU per
    document and per segment, paired p-values and the dropped-pronoun figures;
    multi-resolution's training log has its resolutions; G-Transformer's
    pretrained parameters at 0.2x; a re-run skips every step."""
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=12, dp=True)
    work = tmp_path / "w"
    # segments of at most 40 tokens: several per episode (the per-segment d-BLEU is not
    # the per-document one)
    env = {"MODELS": "transformer concat doc2doc doc2doc_mr gtrans", "SENT_UPDATES": "30",
           "DOC_TOKENS": "2500", "D2D_MAX_TOKENS": "40"}
    r = _run(TVSUB, ["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r.returncode == 0, r.stderr[-6000:]
    smoke = work / "smoke"
    seg_map = smoke / "segments" / "test.40.segments"
    assert _lines(seg_map) > 2
    res = json.loads((smoke / "results" / "results.json").read_text())
    models = ["sentence", "transformer", "concat", *D2D]
    assert list(res["models"]) == models
    for m in models:
        row = res["models"][m]
        for k in ("bleu_all_refs", "bleu_first_ref", "d_bleu_all_refs", "d_bleu_first_ref",
                  "d_bleu_segments_first_ref"):
            assert isinstance(row[k], float), (m, k)
        assert row["dp"]["items"] > 0, m
        if m != "transformer":
            assert "p_sentences" in row["paired_test"], m
            # the paired test drawing whole segments of the shared map
            assert row["paired_segments"]["segments"] == _lines(seg_map), m
    for m in D2D:
        _check_d2d_outputs(smoke, m, smoke / "docs" / "test.docids", seg_map)
        assert res["models"][m]["doc2doc_split"]["mismatched_segments"] == 0
        assert "--doc2doc-frame" in res["models"][m]["commands"]["fairseq-generate"]
        assert "--finetune-from-model" in res["models"][m]["train_options"]
        # the equal target-token budget counts a segment's target tokens
        budget = res["models"][m]["budget"]
        assert budget["updates"] >= 1 and budget["target_tokens_planned"] >= 2500, budget
    assert "--lr-scale-pretrained 0.2" in res["models"]["gtrans"]["train_options"]
    assert "--doc2doc multires" in res["models"]["doc2doc_mr"]["train_options"]
    log = (smoke / "logs" / "train-doc2doc_mr.log").read_text()
    assert re.search(r"multires segments of at most 40 tokens", log), log[-3000:]
    md = (smoke / "results" / "results.md").read_text()
    assert "## Documents as the unit of translation" in md
    assert re.search(r"\| gtrans \| transformer_gtrans, G-Transformer \(Bao et al\. 2021\) \| "
                     r"[0-9.]+ \[", md)
    r2 = _run(TVSUB, ["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert not re.search(r"\] step \w", r2.stderr), r2.stderr[-2000:]


@pytest.mark.slow
@needs_ted
def test_maruf_pipeline_doc2doc_rows_end_to_end(tmp_path):
    """The IWSLT17 TED recipe's smoke mode with the doc2doc rows: results/
    doc2doc.md with every model's s-BLEU, d-BLEU per document and per segment
    (tokenized and sacreBLEU), the pronoun suite and the paired p; the shared
    results table lists the rows too."""
    work = tmp_path / "w"
    env = {"BASELINES": " ".join(D2D), "VARIANTS": "", "SMOKE_SENT_UPDATES": "60"}
    r = _run(TED, ["--smoke", "--raw", DATA, "--workdir", str(work)], env=env)
    assert r.returncode == 0, r.stderr[-6000:]
    smoke = work / "smoke"
    seg_map = smoke / "segments" / "test.128.segments"
    for m in D2D:
        _check_d2d_outputs(smoke, m, smoke / "data-bin" / "test.docids", seg_map)
        assert (smoke / "results" / m / "contrastive_pronouns.json").exists(), m
        assert (smoke / "results" / m / "paired.json").exists(), m
        g = json.loads((smoke / "results" / m / "paired_segments.json").read_text())["segments"]
        assert g["segments"] == _lines(seg_map), m
    table = json.loads((smoke / "results" / "doc2doc.json").read_text())
    rows = {r["model"]: r for r in table["models"]}
    assert list(rows) == ["sentence", *D2D]
    for m, row in rows.items():
        for kind in ("tokenized_bleu", "sacrebleu"):
            for k in ("s_bleu", "d_bleu_documents", "d_bleu_segments"):
                assert isinstance(row[kind][k], float), (m, kind, k)
        assert row["pronouns"]["n"] > 0
    md = (smoke / "results" / "table.md").read_text()
    for m in D2D:
        assert f"| {m} |" in md, m
    assert "(Bao et al. 2021)" in (smoke / "results" / "doc2doc.md").read_text()


@pytest.mark.slow
@needs_ted
def test_ted_without_a_training_set_trains_on_the_xml_sets(tmp_path):
    """The shared copy has no train.tags: the full mode's data steps train on
    dev2010 and tst2010-tst2014 (3 talks of tst2014 for validation), test on
    tst2015, and say so."""
    work = tmp_path / "w"
    r = _run(TED, ["--raw", DATA, "--workdir", str(work), "--cpu"],
             env={"UNTIL": "data", "BPE_MERGES": "300"})
    assert r.returncode == 0, r.stderr[-4000:]
    assert "training on dev2010 and tst2010-tst2014" in r.stderr
    docs = work / "docs"

    def talks(split):
        return len(set((docs / f"{split}.docids").read_text().split()))
    assert talks("valid") == 3 and talks("test") == 12
    splits = (work / "results" / "splits.txt").read_text()
    assert "test tst2015" in splits and "Not the paper's split" in splits
    # tst2014's other talks are in training, no talk twice
    n = {s: _lines(docs / f"{s}.docids") for s in ("train", "valid", "test")}
    assert n["train"] > 7000 and n["valid"] == 220 and n["test"] == 1080, n
