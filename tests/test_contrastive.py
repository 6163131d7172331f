"""ctx-score-contrastive: one scorer, the task's context, every format.

The strongest checks compare independent paths: the scores of the reference
candidates against fairseq's training/validation batches of the split, and
the same examples written in every suite format against the toy format."""

import json
import os
import sys
import types

import numpy as np
import pytest
import torch

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.eval.scoring import contrastive as C
from ctx_fairseq.eval.scoring.contrastive_suites import read_suite
from ctx_fairseq.eval.scoring.suite_report import SuiteOptions
from suite_fixtures import toy_examples, write_contrapro, write_pairs, write_voita


def _jsonl(toy_corpus):
    return os.path.join(toy_corpus, "test.contrastive.jsonl")


def _scores(ckpt, data, path, fmt="toy", **kw):
    res, suite, scores = C.evaluate_checkpoint(ckpt, data, path, SuiteOptions(fmt=fmt, **kw),
                                               return_scores=True)
    return res, suite, scores


@torch.no_grad()
def _validation_logprobs(ckpt, data, lines):
    """Sum of reference log-probabilities of split lines, from fairseq's own
    batches of the split (as validation builds them)."""
    model, task, _ = C.load_checkpoint(ckpt, data)
    task.load_dataset("test")
    ds = task.datasets["test"]
    itr = task.get_batch_iterator(ds, max_tokens=4000, seed=1,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    out = {}
    for sample in itr:
        net_output = model(**sample["net_input"])
        lp = model.get_normalized_probs(net_output, log_probs=True)
        tok = lp.gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1).double()
        tok = tok.masked_fill(sample["target"].eq(pad), 0)
        for i, s in zip(sample["id"].tolist(), tok.sum(-1).tolist()):
            out[i] = s
    return [out[i] for i in lines]


@pytest.mark.parametrize("which", ["sentence", "context"])
def test_reference_scores_equal_validation_batches(which, sentence_ckpt, context_ckpt, toy_bin,
                                                   toy_corpus):
    ckpt = sentence_ckpt if which == "sentence" else context_ckpt[0]
    res, suite, scores = _scores(ckpt, toy_bin, _jsonl(toy_corpus))
    lines = [ex.corpus_line for ex in suite.examples]
    ref = _validation_logprobs(ckpt, toy_bin, lines)
    np.testing.assert_allclose([s[0] for s in scores], ref, atol=1e-4)
    assert res["context"].startswith("none" if which == "sentence" else "document")
    assert res["overall"]["n"] == len(suite.examples)
    g = res["overall"]
    assert g["correct"] + g["ties"] + g["wrong"] == g["n"]


def test_every_format_scores_like_the_toy_format(context_ckpt, toy_bin, toy_corpus, tmp_path):
    """transformer_context_aware (one previous source sentence): the same
    examples through every public format give the toy format's scores."""
    ckpt = context_ckpt[0]
    _, _, toy = _scores(ckpt, toy_bin, _jsonl(toy_corpus))
    exs = toy_examples(toy_corpus, k=1)
    voita = write_voita(str(tmp_path / "v.json"), exs)
    _, _, sv = _scores(ckpt, toy_bin, voita, fmt="voita")
    np.testing.assert_allclose(np.concatenate(sv), np.concatenate(toy), atol=1e-4)
    # ContraPro with 2 context lines (the model takes the nearest one)
    cp = write_contrapro(str(tmp_path / "contrapro"), toy_examples(toy_corpus, k=2), n_ctx=2)
    _, _, sc = _scores(ckpt, toy_bin, cp, fmt="contrapro")
    np.testing.assert_allclose(np.concatenate(sc), np.concatenate(toy), atol=1e-4)
    first_two = [s[:2] for s in toy]
    bw = write_pairs(str(tmp_path / "anaphora"), exs, "bawden")
    _, _, sb = _scores(ckpt, toy_bin, bw, fmt="bawden", langs=("en", "fr"))
    np.testing.assert_allclose(np.concatenate(sb), np.concatenate(first_two), atol=1e-4)
    lp = write_pairs(str(tmp_path / "OpenSubs"), exs, "lopes", n_ctx=1)
    _, _, sl = _scores(ckpt, toy_bin, lp, fmt="lopes", suite_context=1)
    np.testing.assert_allclose(np.concatenate(sl), np.concatenate(first_two), atol=1e-4)


def test_context_is_used_and_shuffled_context_differs(context_ckpt, toy_bin, toy_corpus,
                                                      tmp_path):
    ckpt = context_ckpt[0]
    exs = toy_examples(toy_corpus, k=1)
    voita = write_voita(str(tmp_path / "v.json"), exs)
    _, _, true = _scores(ckpt, toy_bin, voita, fmt="voita")
    # the same suite without its context sentences scores differently
    bare = [dict(e, ctx_src=[], ctx_tgt=[]) for e in exs]
    nctx = write_voita(str(tmp_path / "bare.json"), bare)
    with pytest.raises(ValueError, match=r"uses 1 previous sentence\(s\) of context, but .* "
                                         r"gives 0 per example"):
        _scores(ckpt, toy_bin, nctx, fmt="voita")
    res_s, _, shuf = _scores(ckpt, toy_bin, voita, fmt="voita", ablation="shuffled")
    with_ctx = [i for i, e in enumerate(exs) if e["ctx_src"]]
    assert with_ctx
    diff = [abs(true[i][0] - shuf[i][0]) for i in with_ctx]
    assert max(diff) > 1e-3
    assert res_s["context_ablation"] == "shuffled"


def test_shuffled_context_is_the_same_for_every_candidate(context_ckpt, toy_bin, toy_corpus,
                                                          tmp_path):
    model, task, cfg = C.load_checkpoint(context_ckpt[0], toy_bin)
    from ctx_fairseq.eval.text_units import TextEncoder, add_text_unit_args
    import argparse

    p = argparse.ArgumentParser()
    add_text_unit_args(p)
    s, t = TextEncoder.pair_from_args(p.parse_args([]), task, cfg)
    scorer = C.ContrastiveScorer(model, task, s, t, condition=ContextCondition("shuffled"))
    for suite in (read_suite("toy", _jsonl(toy_corpus)),
                  read_suite("voita", write_voita(str(tmp_path / "v.json"),
                                                  toy_examples(toy_corpus, 1)))):
        ranks = scorer.rank_datasets(suite)
        assert len(ranks) == 3  # pronoun records have three candidates
        donors = [ds.donor for ds, _ in ranks]
        assert donors[0] is not None
        for d in donors[1:]:
            np.testing.assert_array_equal(d, donors[0])
        ds0, rows0 = ranks[0]
        for ds, rows in ranks[1:]:
            for r in rows[rows >= 0]:
                assert torch.equal(ds.context_tokens(int(r)), ds0.context_tokens(int(r)))


def test_sentence_level_checkpoint(sentence_ckpt, toy_bin, toy_corpus, tmp_path):
    with pytest.raises(ValueError, match="no context to ablate"):
        C.evaluate_checkpoint(sentence_ckpt, toy_bin, _jsonl(toy_corpus),
                              SuiteOptions(ablation="shuffled"))
    # a sentence-level model ignores the suite's context: same scores with and without it
    exs = toy_examples(toy_corpus, k=1)
    _, _, a = _scores(sentence_ckpt, toy_bin, write_voita(str(tmp_path / "a.json"), exs),
                      fmt="voita")
    bare = [dict(e, ctx_src=[], ctx_tgt=[]) for e in exs]
    _, _, b = _scores(sentence_ckpt, toy_bin, write_voita(str(tmp_path / "b.json"), bare),
                      fmt="voita")
    np.testing.assert_allclose(np.concatenate(a), np.concatenate(b), atol=1e-4)


def test_ties_are_counted_separately(sentence_ckpt, toy_bin, toy_corpus, tmp_path):
    recs = [json.loads(x) for x in open(_jsonl(toy_corpus))]
    recs[0]["contrastive"] = [recs[0]["ref"]]  # identical candidates: a tie, not an error
    p = tmp_path / "ties.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = C.evaluate_checkpoint(sentence_ckpt, toy_bin, str(p))
    assert res["examples"][0]["outcome"] == "tie"
    assert res["overall"]["ties"] >= 1
    assert res["overall"]["accuracy"] == res["overall"]["correct"] / res["overall"]["n"]
    assert "ties" in C.format_result(res)


def test_summarize_outcomes():
    from ctx_fairseq.eval.scoring.contrastive_suites import Candidate, Example, Suite

    exs = [Example("s", [Candidate("a"), Candidate("b")], 0, "p", "1"),
           Example("s", [Candidate("a"), Candidate("b"), Candidate("c")], 2, "p", "2"),
           Example("s", [Candidate("a"), Candidate("b")], 1, "q", "1"),
           Example("s", [Candidate("a"), Candidate("b")], 0, "q", None)]
    suite = Suite("voita", "x.json", "x", exs, 1, True)
    r = C.summarize(suite, [[-1.0, -2.0], [-1.0, -3.0, -2.0], [-1.0, -1.00005], [-5.0, -1.0]],
                    tie_tolerance=1e-4)
    assert [e["outcome"] for e in r["examples"]] == ["correct", "wrong", "tie", "wrong"]
    assert r["overall"] == {"n": 4, "correct": 1, "ties": 1, "wrong": 2, "accuracy": 0.25}
    assert r["by_phenomenon"]["q"]["ties"] == 1
    assert r["by_distance"]["p"]["2"]["wrong"] == 1
    assert r["by_distance_overall"]["1"]["n"] == 2 and "None" not in r["by_distance_overall"]


def test_context_checks_without_a_model():
    from ctx_fairseq.data.contract import ContextSpec
    from ctx_fairseq.eval.scoring.contrastive_suites import Suite

    scorer = C.ContrastiveScorer.__new__(C.ContrastiveScorer)
    scorer.context, scorer.notes, scorer.gold_target_context = True, [], False
    cfg = dict(target_context_size=0, source_context_size=1, context_direction="prev",
               document_context="none")
    suite = Suite("voita", "v.json", "v", [], 3, True)

    def check(**kw):  # (the scorer reads the checkpoint's context specification)
        scorer.spec = ContextSpec(**{**cfg, **kw})
        scorer.check_context(suite)

    check()
    with pytest.raises(C.ContextUnavailable, match="--context-direction both .* previous "
                                                   "sentences only"):
        check(context_direction="both")
    with pytest.raises(C.ContextUnavailable, match="--document-context offline"):
        check(document_context="offline")
    with pytest.raises(C.ContextUnavailable, match="uses 4 previous"):
        check(source_context_size=4)
    scorer.allow_partial_document = False
    with pytest.raises(C.ContextUnavailable, match="--allow-partial-document"):
        check(document_context="online", source_context_size=1)
    scorer.allow_partial_document = True
    check(document_context="online", source_context_size=1)
    assert "up to 3 previous" in scorer.notes[-1]
    with pytest.raises(C.ContextUnavailable, match="gives no target-side context"):
        suite.target_context = False
        check(target_context_size=1)
    toy = Suite("toy", "t.jsonl", "t", [], None, True)
    scorer.spec = ContextSpec(**{**cfg, "target_context_size": 1})
    with pytest.raises(C.ContextUnavailable, match="--gold-target-context"):
        scorer.check_context(toy)
    scorer.gold_target_context = True
    scorer.check_context(toy)


def test_toy_records_are_checked(context_ckpt, toy_bin, toy_corpus, tmp_path):
    recs = [json.loads(x) for x in open(_jsonl(toy_corpus))]
    bad = tmp_path / "bad.jsonl"
    r0 = dict(recs[0], doc_id="no-such-doc")
    bad.write_text(json.dumps(r0) + "\n")
    with pytest.raises(ValueError, match="but the record says 'no-such-doc'"):
        C.evaluate_checkpoint(context_ckpt[0], toy_bin, str(bad))
    bad.write_text(json.dumps(dict(recs[0], src="we walk again .")) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: id \d+: src .* differs from line"):
        C.evaluate_checkpoint(context_ckpt[0], toy_bin, str(bad))
    bad.write_text(json.dumps(dict(recs[0], id=10 ** 6)) + "\n")
    with pytest.raises(ValueError, match="outside test"):
        C.evaluate_checkpoint(context_ckpt[0], toy_bin, str(bad))


def test_selective_decoder_memory(selective_dec_ckpt, toy_bin, toy_corpus, tmp_path):
    """Whole-document model with target memory: the toy format needs
    --gold-target-context; a suite with one previous sentence gives the same
    scores as the toy format for records whose document has at most that."""
    ckpt = selective_dec_ckpt
    with pytest.raises(ValueError, match="--gold-target-context"):
        C.evaluate_checkpoint(ckpt, toy_bin, _jsonl(toy_corpus))
    _, suite, toy = _scores(ckpt, toy_bin, _jsonl(toy_corpus), gold_target_context=True)
    exs = toy_examples(toy_corpus, k=1)
    voita = write_voita(str(tmp_path / "v.json"), exs)
    with pytest.raises(ValueError, match="--allow-partial-document"):
        C.evaluate_checkpoint(ckpt, toy_bin, voita, SuiteOptions(fmt="voita"))
    res, _, sv = _scores(ckpt, toy_bin, voita, fmt="voita", allow_partial_document=True)
    assert any("whole-document model" in n for n in res["notes"])
    recs = [json.loads(x) for x in open(_jsonl(toy_corpus))]
    near = [i for i, r in enumerate(recs) if r["sent_index"] <= 1]
    assert near
    for i in near:
        np.testing.assert_allclose(sv[i], toy[i], atol=1e-4)


def test_tokenizer_and_bpe_path(sentence_ckpt, toy_bin, toy_corpus, tmp_path):
    from subword_nmt import learn_bpe

    exs = toy_examples(toy_corpus, k=1)
    plain = write_voita(str(tmp_path / "plain.json"), exs)
    _, _, a = _scores(sentence_ckpt, toy_bin, plain, fmt="voita")

    def detok(s):  # "it sleeps now ." -> "it sleeps now."
        return s.replace(" .", ".").replace(" ,", ",").replace(" ?", "?")

    raw = [dict(e, src=detok(e["src"]), ref=detok(e["ref"]),
                contrastive=[detok(c) for c in e["contrastive"]]) for e in exs]
    assert raw[0]["src"] != exs[0]["src"]
    raw_path = write_voita(str(tmp_path / "raw.json"), raw)
    # BPE codes learned with enough merges to rebuild every toy word
    codes = tmp_path / "codes"
    with open(os.path.join(toy_corpus, "train.src")) as s, \
            open(os.path.join(toy_corpus, "train.tgt")) as t, open(codes, "w") as out:
        import io

        learn_bpe.learn_bpe(io.StringIO(s.read() + t.read()), out, 5000, min_frequency=1)
    text = ["--tokenizer", "moses", "--moses-source-lang", "en", "--moses-target-lang", "de",
            "--bpe", "subword_nmt", "--bpe-codes", str(codes)]
    out_dir = str(tmp_path / "out")
    res = C.cli_main(["--path", sentence_ckpt, "--data", toy_bin, "--contrastive", raw_path,
                      "--format", "voita", "--out-dir", out_dir, *text])
    b = [e["scores"] for e in res["examples"]]
    np.testing.assert_allclose(np.concatenate(b), np.concatenate(a), atol=1e-4)
    assert res["unknown_rate"]["source"] == 0.0
    # without the tokenizer the detokenized text has unknown words: reported
    res2 = C.cli_main(["--path", sentence_ckpt, "--data", toy_bin, "--contrastive", raw_path,
                       "--format", "voita", "--out-dir", out_dir])
    assert res2["unknown_rate"]["source"] > 0.05
    assert any("<unk>" in n for n in res2["notes"])
    # a BPE that splits words into units the dictionary lacks shows the same way
    few = tmp_path / "few"
    few.write_text("#version: 0.2\nt h\n")
    res3 = C.cli_main(["--path", sentence_ckpt, "--data", toy_bin, "--contrastive", plain,
                       "--format", "voita", "--out-dir", out_dir, "--bpe", "subword_nmt",
                       "--bpe-codes", str(few)])
    assert res3["unknown_rate"]["target"] > 0.05
    with pytest.raises(SystemExit):
        C.cli_main(["--path", sentence_ckpt, "--data", toy_bin, "--contrastive", plain,
                    "--format", "voita", "--bpe", "subword_nmt"])


def test_cli_outputs(context_ckpt, toy_bin, toy_corpus, tmp_path, capsys):
    out = tmp_path / "rep"
    scores = tmp_path / "scores.txt"
    res = C.cli_main(["--path", context_ckpt[0], "--data", toy_bin, "--contrastive",
                      _jsonl(toy_corpus), "--out-dir", str(out), "--scores-out", str(scores)])
    printed = capsys.readouterr().out
    assert "overall:" in printed and "| category | distance |" in printed
    for ext in ("md", "json", "png"):
        assert (out / f"test.contrastive.{ext}").exists() or \
            (out / f"contrastive_test.contrastive.{ext}").exists()
    png = out / "contrastive_test.contrastive.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    data = json.loads((out / "contrastive_test.contrastive.json").read_text())
    assert data["overall"] == res["overall"]
    lines = scores.read_text().splitlines()
    assert len(lines) == sum(len(e["scores"]) for e in res["examples"])
    # losses (lower is better), the official scripts' default
    assert float(lines[0]) == pytest.approx(-res["examples"][0]["scores"][0], abs=1e-5)
    assert not list(out.glob("*.partial*"))
    # the same figures as the API the demo calls
    assert C.evaluate_checkpoint(context_ckpt[0], toy_bin, _jsonl(toy_corpus))["overall"] == \
        res["overall"]
    # shuffled context: its own file name
    C.cli_main(["--path", context_ckpt[0], "--data", toy_bin, "--contrastive",
                _jsonl(toy_corpus), "--out-dir", str(out), "--context-ablation", "shuffled",
                "--json"])
    assert (out / "contrastive_test.contrastive_shuffled.json").exists()
    with pytest.raises(SystemExit):
        C.cli_main(["--path", str(tmp_path / "none.pt"), "--data", toy_bin, "--contrastive",
                    _jsonl(toy_corpus)])
    with pytest.raises(SystemExit):
        C.cli_main(["--path", context_ckpt[0], "--data", toy_bin, "--contrastive",
                    _jsonl(toy_corpus), "--max-tokens", "3"])


def test_console_script_returns_none(context_ckpt, toy_bin, toy_corpus, tmp_path, monkeypatch,
                                     capsys):
    """A console script hands its return value to sys.exit: it must be None."""
    from ctx_fairseq.cli import entry_points

    setup = open(os.path.join(os.path.dirname(__file__), "..", "setup.py")).read()
    assert '"ctx-score-contrastive = ctx_fairseq.cli.entry_points:score_contrastive"' in setup
    monkeypatch.setattr("sys.argv", ["ctx-score-contrastive", "--path", context_ckpt[0], "--data",
                                     toy_bin, "--contrastive", _jsonl(toy_corpus), "--out-dir",
                                     str(tmp_path)])
    assert entry_points.score_contrastive() is None
    out = capsys.readouterr()
    assert "overall:" in out.out and "DEBUG:matplotlib" not in out.err


def test_options_for_other_formats_are_errors(context_ckpt, sentence_ckpt, toy_bin, toy_corpus,
                                              tmp_path):
    voita = write_voita(str(tmp_path / "v.json"), toy_examples(toy_corpus, 1))
    for kw, match in ((dict(suite_context=2), "for --format lopes"),
                      (dict(langs=("en", "de")), "for --format contrapro and bawden"),
                      (dict(gold_target_context=True), "for --format toy"),
                      (dict(split="valid"), "for --format toy")):
        with pytest.raises(ValueError, match=match):
            C.evaluate_checkpoint(context_ckpt[0], toy_bin, voita,
                                  SuiteOptions(fmt="voita", **kw))
    with pytest.raises(ValueError, match="must be >= 0"):
        C.evaluate_checkpoint(context_ckpt[0], toy_bin, voita, SuiteOptions(fmt="voita"),
                              tie_tolerance=-1.0)
    with pytest.raises(ValueError, match="no context to ablate"):
        C.evaluate_checkpoint(sentence_ckpt, toy_bin, voita,
                              SuiteOptions(fmt="voita", ablation="shuffled"))


def test_truecasing_model_is_applied_after_tokenizing(tmp_path):
    import argparse
    import subprocess

    from fairseq.data import Dictionary

    from ctx_fairseq.eval.text_units import TextEncoder, add_text_unit_args

    model = tmp_path / "tc.en"
    text = tmp_path / "t.txt"
    text.write_text("we saw the cat .\nit is the cat .\n" * 5)
    subprocess.run(f"sacremoses -q -j 1 train-truecase -m {model} < {text}", shell=True,
                   check=True)
    d = Dictionary()
    for w in "the cat ran .".split():
        d.add_symbol(w)
    p = argparse.ArgumentParser()
    add_text_unit_args(p)
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    a = p.parse_args(["--tokenizer", "moses", "--moses-source-lang", "en", "--moses-target-lang",
                      "de", "--truecase-source-model", str(model)])
    s, t = TextEncoder.pair_from_args(a, task)
    assert s.units("The cat ran.") == "the cat ran ."  # truecased source, sentence start
    assert t.units("The cat ran.") == "The cat ran ."  # no target model: unchanged
    assert s.encode("The cat ran.").tolist()[:1] == [d.index("the")]
    with pytest.raises(ValueError, match="no such file"):
        TextEncoder.pair_from_args(p.parse_args(["--truecase-target-model",
                                                 str(tmp_path / "x")]), task)


def test_moses_protect_entities_is_the_recipes_tokenization(tmp_path):
    """--moses-protect-entities tokenizes raw suite text exactly as the
    recipes' moses_tok tokenized the training data (entities whole, no
    escaping); fairseq's own moses tokenizer splits them."""
    import argparse
    import subprocess

    from fairseq.data import Dictionary

    from ctx_fairseq.eval.text_units import TextEncoder, add_text_unit_args

    text = "Tom &amp; Jerry's well-known \"show\" <b> &#39; ends."
    raw = tmp_path / "raw.en"
    raw.write_text(text + "\n", encoding="utf-8")
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "recipes", "lib", "recipe.sh")
    out = tmp_path / "tok.en"
    subprocess.run(["bash", "-c", f'RECIPE_NAME=t; . "{lib}"; moses_tok en "$1" "$2"', "x",
                    str(raw), str(out)], check=True, env=dict(os.environ, PYTHON=sys.executable))
    recipe = out.read_text(encoding="utf-8").strip()
    assert "&amp;" in recipe.split() and "&#39;" in recipe.split()
    p = argparse.ArgumentParser()
    add_text_unit_args(p)
    task = types.SimpleNamespace(source_dictionary=Dictionary(), target_dictionary=Dictionary())
    base = ["--tokenizer", "moses", "--moses-source-lang", "en", "--moses-target-lang", "en",
            "--moses-no-escape", "--moses-no-dash-splits"]
    s, _ = TextEncoder.pair_from_args(p.parse_args(base + ["--moses-protect-entities"]), task)
    assert s.units(text) == recipe
    s, _ = TextEncoder.pair_from_args(p.parse_args(base), task)
    assert s.units(text) != recipe  # fairseq's tokenizer splits "&amp;"
    with pytest.raises(ValueError, match="--moses-no-escape"):
        TextEncoder.pair_from_args(p.parse_args(["--tokenizer", "moses", "--moses-source-lang",
                                                 "en", "--moses-target-lang", "en",
                                                 "--moses-protect-entities"]), task)
