"""ctx-generative-accuracy: distinguishing words, outcomes of hand-made
translations (correct, contrastive, paraphrase, both words), the summary by
category and distance, every suite format, and translations of a tiny trained
model (fairseq-generate's and the command's own)."""

import json
import os

import pytest

from ctx_fairseq.eval.scoring import generative_accuracy as ga
from ctx_fairseq.eval.scoring.contrastive_suites import Candidate, Example, Suite, read_suite
from ctx_fairseq.eval.scoring.suite_report import SuiteOptions
from suite_fixtures import toy_examples, write_contrapro, write_pairs, write_voita

pytestmark = pytest.mark.usefixtures("one_thread")


def _ex(correct, *others, category="pronoun", distance="1", correct_index=0, source="it sleeps ."):
    cands = [Candidate(t) for t in others]
    cands.insert(correct_index, Candidate(correct))
    return Example(source, cands, correct_index, category, distance, "hand")


def test_words_fold_case_bpe_entities_and_punctuation():
    assert ga.words("Er schläft, jetzt.") == ["er", "schläft", "jetzt"]
    assert ga.words("er schl@@ äft jetzt .") == ["er", "schläft", "jetzt"]
    assert ga.words("\u2581Er \u2581schl äft") == ["er", "schläft"]
    assert ga.words("c&apos;est l'homme") == ["c", "est", "l", "homme"]
    assert ga.words("Sie kommt", case_sensitive=True) == ["Sie", "kommt"]
    assert ga.words("a_b") == ["a", "b"]


def test_distinguishing_words_by_hand():
    ex = _ex("er schlaeft jetzt .", "sie schlaeft jetzt .", "es schlaeft jetzt .")
    req, forb, pairs = ga.distinguishing_words(ex)
    assert req == {"er"} and forb == {"sie", "es"}
    assert pairs == [({"er"}, {"sie"}), ({"er"}, {"es"})]
    # the correct candidate need not be first; a word in both candidates is not distinguishing
    ex = _ex("er sah sie , sie lachte .", "er sah sie , er lachte .", correct_index=1)
    assert ex.correct == 1
    req, forb, _ = ga.distinguishing_words(ex)
    assert (req, forb) == (set(), set())  # differ only in how often a word occurs
    ex = _ex("Er schläft.", "er schläft .")
    assert ga.distinguishing_words(ex)[:2] == (set(), set())
    assert ga.distinguishing_words(ex, case_sensitive=True)[:2] == ({"Er"}, {"er"})


def test_toy_records_distinguishing_words_are_their_words(toy_corpus):
    """On the toy corpus the words read off the candidates are the records'
    own ``word`` / ``contrastive_words``."""
    path = os.path.join(toy_corpus, "test.contrastive.jsonl")
    recs = [json.loads(line) for line in open(path)]
    suite = read_suite("toy", path)
    assert len(recs) == len(suite.examples) > 10
    for rec, ex in zip(recs, suite.examples):
        req, forb, _ = ga.distinguishing_words(ex)
        assert req == {rec["word"]} and forb == set(rec["contrastive_words"]), rec


@pytest.mark.parametrize("hyp,outcome", [
    ("er schlaeft jetzt .", "correct"),
    ("Er schläft jetzt.", "correct"),  # case and punctuation do not matter, and only the
    ("Er schlaeft.", "correct"),  # distinguishing words are judged, not the rest
    ("sie schlaeft jetzt .", "contrastive"),
    ("es schlaeft .", "contrastive"),
    ("der hund schlaeft jetzt .", "other"),  # a paraphrase counts as wrong
    ("er oder sie schlaeft .", "both"),
    ("sie und es schlafen .", "contrastive"),  # the words of a contrastive candidate, no er
    ("", "other"),
])
def test_outcomes_of_hand_made_translations(hyp, outcome):
    ex = _ex("er schlaeft jetzt .", "sie schlaeft jetzt .", "es schlaeft jetzt .")
    assert ga.judge(hyp, ex) == outcome


def test_contrastive_outcome_needs_a_whole_contrastive_difference():
    ex = _ex("das robbentier ist klein .", "das siegel ist klein .", category="lexical_cohesion")
    assert ga.judge("das siegel ist klein", ex) == "contrastive"
    assert ga.judge("das siegel und das robbentier", ex) == "both"
    # the correct candidate's words are a subset of the contrastive one's
    ex = _ex("ich auch .", "ich auch nicht .")
    assert ga.distinguishing_words(ex)[:2] == (set(), {"nicht"})
    assert ga.judge("ich auch", ex) == "correct"
    assert ga.judge("ich nicht", ex) == "contrastive"


def test_summary_by_category_and_distance_undecidable_apart():
    exs = [_ex("er a .", "sie a .", distance="1"),
           _ex("er b .", "sie b .", distance="1"),
           _ex("er c .", "sie c .", distance="2"),
           _ex("x y .", "x , y", distance="2"),  # no distinguishing word
           _ex("das robbentier .", "das siegel .", category="lexical_cohesion", distance="1")]
    suite = Suite("toy", "hand.jsonl", "hand", exs, 1, True)
    hyps = ["er a", "sie b", "er und sie c", "x y", "das tier"]
    r = ga.summarize(suite, hyps)
    assert [e["outcome"] for e in r["examples"]] == \
        ["correct", "contrastive", "both", "undecidable", "other"]
    o = r["overall"]
    assert (o["n"], o["correct"], o["contrastive"], o["both"], o["other"], o["undecidable"]) == \
        (4, 1, 1, 1, 1, 1)
    assert o["accuracy"] == pytest.approx(1 / 4)
    assert r["by_phenomenon"]["pronoun"]["accuracy"] == pytest.approx(1 / 3)
    assert r["by_phenomenon"]["pronoun"]["undecidable"] == 1
    assert r["by_distance"]["pronoun"]["1"]["accuracy"] == pytest.approx(1 / 2)
    assert r["by_distance"]["pronoun"]["2"]["n"] == 1  # the undecidable one left out
    assert r["by_distance_overall"]["1"]["n"] == 3
    assert r["by_phenomenon"]["lexical_cohesion"]["accuracy"] == 0.0
    # an all-undecidable group has no accuracy, not 0
    r = ga.summarize(Suite("toy", "h", "h", [exs[3]], 1, True), ["x y"])
    assert r["overall"]["n"] == 0 and r["overall"]["accuracy"] is None
    table = ga.format_result(ga.summarize(suite, hyps))
    assert "| all | 1 | 3 | 1 | 1 | 0 | 1 | 0 | 33.3 |" in table
    with pytest.raises(ValueError, match="4 translations for 5 examples"):
        ga.summarize(suite, hyps[:4])


def _write_generate(path, items):
    with open(path, "w") as f:
        for sid, src, hyp in items:
            f.write(f"S-{sid}\t{src}\nT-{sid}\tref\nH-{sid}\t-0.5\t{hyp}\nD-{sid}\t-0.5\t{hyp}\n")
    return path


def _suites(toy_corpus, tmp_path):
    """The toy test records in every format (one context sentence)."""
    exs = toy_examples(toy_corpus, k=1)
    toy = os.path.join(toy_corpus, "test.contrastive.jsonl")
    out = {"toy": (read_suite("toy", toy), toy),
           "voita": (None, write_voita(str(tmp_path / "deixis_test.json"), exs, true_last=True)),
           "contrapro": (None, write_contrapro(str(tmp_path / "contrapro"), exs, 1)),
           "bawden": (None, write_pairs(str(tmp_path / "anaphora"), exs, "bawden")),
           "lopes": (None, write_pairs(str(tmp_path / "OpenSubs"), exs, "lopes", 1))}
    kw = {"lopes": {"context": 1}}
    return {f: (read_suite(f, p, **kw.get(f, {})) if s is None else s, p)
            for f, (s, p) in out.items()}


def test_every_format_same_outcomes(toy_corpus, tmp_path):
    """The same hand-made translations judged through each format: toy ids
    are lines of the split, the others' are example numbers. Bawden's and
    Lopes' pairs keep the first contrastive candidate only, so a translation
    with the second one's pronoun is 'other' there."""
    suites = _suites(toy_corpus, tmp_path)
    toy_suite = suites["toy"][0]
    recs = [json.loads(line) for line in open(suites["toy"][1])]
    # correct, first contrastive, last contrastive, a paraphrase, cycling
    hyps = [[r["ref"], r["contrastive"][0], r["contrastive"][-1], "ganz anders ."][i % 4]
            for i, r in enumerate(recs)]
    gen = _write_generate(str(tmp_path / "toy.gen"),
                          [(ex.corpus_line, ex.source, h) for ex, h in zip(toy_suite.examples,
                                                                           hyps)])
    base = ga.summarize(toy_suite, ga.translations_from_file(toy_suite, gen))
    outs = [e["outcome"] for e in base["examples"]]
    assert set(outs) == {"correct", "contrastive", "other"}
    assert base["overall"]["accuracy"] == pytest.approx(outs.count("correct") / len(outs))
    for fmt, (suite, path) in suites.items():
        if fmt == "toy":
            continue
        g = _write_generate(str(tmp_path / f"{fmt}.gen"),
                            [(i, ex.source, h) for i, (ex, h) in enumerate(zip(suite.examples,
                                                                               hyps))])
        res, s2, got = ga.evaluate(path, generate_output=g, options=SuiteOptions(
            fmt=fmt, suite_context=1 if fmt == "lopes" else None))
        assert got == hyps
        mine = [e["outcome"] for e in res["examples"]]
        if fmt in ("voita", "contrapro"):
            assert mine == outs, fmt
            assert res["by_distance_overall"].keys() == base["by_distance_overall"].keys()
        else:  # pairs: the second contrastive candidate is not in the suite
            for r, a, b in zip(recs, outs, mine):
                assert b == a or (a == "contrastive" and b == "other"), (fmt, r)


def test_generate_output_errors(toy_corpus, tmp_path):
    suite = read_suite("toy", os.path.join(toy_corpus, "test.contrastive.jsonl"))
    exs = suite.examples
    gen = _write_generate(str(tmp_path / "a.gen"), [(ex.corpus_line, ex.source, "x")
                                                    for ex in exs[1:]])
    with pytest.raises(ValueError, match=rf"no translation of sentence id {exs[0].corpus_line} "
                                         r".*lines of the binarized split"):
        ga.translations_from_file(suite, gen)
    gen = _write_generate(str(tmp_path / "b.gen"), [(ex.corpus_line, "another sentence .", "x")
                                                    for ex in exs])
    with pytest.raises(ValueError, match="does not end with"):
        ga.translations_from_file(suite, gen)
    # a concatenation model's S- line starts with its context: accepted
    gen = _write_generate(str(tmp_path / "c.gen"), [(ex.corpus_line, "ctx . <brk> " + ex.source,
                                                     "x") for ex in exs])
    assert ga.translations_from_file(suite, gen) == ["x"] * len(exs)
    with pytest.raises(ValueError, match="either --generate-output"):
        ga.evaluate(os.path.join(toy_corpus, "test.contrastive.jsonl"))


# ------------------------------------------------------------ tiny models
def test_tiny_context_model_end_to_end(context_ckpt, toy_bin, toy_corpus, tmp_path, capsys):
    """A tiny transformer_context_aware: its fairseq-generate output on the
    split judged with --generate-output, and the suite translated by the
    command itself (same beam settings): the same translations, the same
    numbers; the translations file it writes reads back the same; the Voita
    format (the same examples and context) gives the same translations."""
    ckpt, gen_text = context_ckpt
    gen = tmp_path / "gen.txt"
    gen.write_text(gen_text)
    toy = os.path.join(toy_corpus, "test.contrastive.jsonl")
    from_file, suite, hyps_file = ga.evaluate(toy, generate_output=str(gen))
    res = ga.cli_main(["--contrastive", toy, "--path", ckpt, "--data", toy_bin, "--beam", "2",
                       "--max-len-b", "20", "--max-tokens", "500", "--out-dir", str(tmp_path),
                       "--name", "tiny"])
    out = capsys.readouterr().out
    assert "generative accuracy:" in out and "| all | 1 |" in out
    mine = [e["translation"] for e in res["examples"]]
    assert mine == hyps_file
    assert res["overall"] == from_file["overall"]
    assert res["context"] == "document_translation task context"
    for ext in ("md", "json", "png"):
        assert os.path.getsize(tmp_path / f"generative_tiny.{ext}") > 0
    again, _, hyps2 = ga.evaluate(toy, generate_output=str(
        tmp_path / "generative_tiny.translations.txt"))
    assert hyps2 == mine and again["overall"] == res["overall"]
    # the same examples through the Voita format (source context 1 = the suite's)
    exs = toy_examples(toy_corpus, k=1)
    voita = write_voita(str(tmp_path / "deixis_test.json"), exs)
    vres, _, vhyps = ga.evaluate(voita, path=ckpt, data=toy_bin,
                                 options=SuiteOptions(fmt="voita"),
                                 decoding=ga.Decoding(beam=2, max_len_b=20))
    assert vhyps == mine
    # a shuffled context is accepted and reported
    sres, _, _ = ga.evaluate(toy, path=ckpt, data=toy_bin,
                             options=SuiteOptions(ablation="shuffled"),
                             decoding=ga.Decoding(beam=2, max_len_b=20))
    assert sres["context_ablation"] == "shuffled" and sres["overall"]["n"] == res["overall"]["n"]


def test_tiny_sentence_model(sentence_ckpt, toy_bin, toy_corpus, tmp_path):
    toy = os.path.join(toy_corpus, "test.contrastive.jsonl")
    res, suite, hyps = ga.evaluate(toy, path=sentence_ckpt, data=toy_bin,
                                   decoding=ga.Decoding(beam=1, max_len_b=10))
    assert res["context"] == "none (sentence-level)" and len(hyps) == len(suite.examples)
    with pytest.raises(ValueError, match="no context to ablate"):
        ga.evaluate(toy, path=sentence_ckpt, data=toy_bin,
                    options=SuiteOptions(ablation="shuffled"))


def test_console_script():
    import shutil
    import subprocess

    exe = shutil.which("ctx-generative-accuracy")
    assert exe, "pip install -e . to install the console scripts"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--generate-output" in out.stdout


def test_tiny_document_memory_model_with_target_context(toy_bin, toy_corpus, tmp_path):
    """transformer_selective_doc_dec (document memory, target context): the
    toy suite is translated with the references as target context only when
    asked (--gold-target-context), as the scorer scores it."""
    from conftest import SELECTIVE_DEC_ARGS
    from fairseq_cli_utils import TINY_MODEL_ARGS, train

    save = str(tmp_path / "seldec")
    train([toy_bin, "--arch", "transformer_selective_doc_dec", *TINY_MODEL_ARGS,
           *SELECTIVE_DEC_ARGS, "--context-memory", "shared", "--share-all-embeddings",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "600", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    ckpt = os.path.join(save, "checkpoint_last.pt")
    toy = os.path.join(toy_corpus, "test.contrastive.jsonl")
    with pytest.raises(ValueError, match="--gold-target-context"):
        ga.evaluate(toy, path=ckpt, data=toy_bin, decoding=ga.Decoding(beam=1, max_len_b=10))
    res, suite, hyps = ga.evaluate(toy, path=ckpt, data=toy_bin,
                                   options=SuiteOptions(gold_target_context=True),
                                   decoding=ga.Decoding(beam=1, max_len_b=10))
    assert len(hyps) == len(suite.examples) and res["overall"]["n"] == len(hyps)


def test_tiny_concat_model_with_target_context_equals_fairseq_generate(toy_bin, toy_corpus,
                                                                      tmp_path):
    """A concatenation model with source and target context (the target
    context a forced decoder prefix, from the references): the translations
    made here are fairseq-generate's on the split with --gold-target-context."""
    from fairseq_cli_utils import TINY_MODEL_ARGS, generate, train

    ctx = ["--task", "document_translation", "--concat-context", "--source-context-size", "1",
           "--target-context-size", "1"]
    save = str(tmp_path / "concat")
    train([toy_bin, "--arch", "transformer", *ctx, *TINY_MODEL_ARGS, "--share-all-embeddings",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "600", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    ckpt = os.path.join(save, "checkpoint_last.pt")
    gen = tmp_path / "gen.txt"
    gen.write_text(generate([toy_bin, "--path", ckpt, *ctx, "--gold-target-context", "--beam",
                             "2", "--max-len-b", "10", "--max-tokens", "2000", "--gen-subset",
                             "test", "--num-workers", "0"]))
    toy = os.path.join(toy_corpus, "test.contrastive.jsonl")
    _, _, from_file = ga.evaluate(toy, generate_output=str(gen))
    res, _, mine = ga.evaluate(toy, path=ckpt, data=toy_bin,
                               options=SuiteOptions(gold_target_context=True),
                               decoding=ga.Decoding(beam=2, max_len_b=10))
    assert mine == from_file and res["overall"]["n"] == len(mine)


def test_translation_on_another_device(context_ckpt, toy_bin, toy_corpus):
    """The model on another device (simulated on the CPU, tests/other_device.py):
    every batch reaches fairseq's generator whole on that device, and the
    translations are the CPU's (float64, so that other kernels cannot flip
    near-ties of the beam search)."""
    import copy

    import torch

    from ctx_fairseq.eval.scoring.contrastive import ContrastiveScorer, load_checkpoint
    from ctx_fairseq.eval.text_units import TextEncoder
    from other_device import OTHER, OtherDeviceMode, checked_generator

    model, task, _cfg = load_checkpoint(context_ckpt[0], toy_bin)
    model = model.double()
    suite = read_suite("toy", os.path.join(toy_corpus, "test.contrastive.jsonl"))

    def scorer(m):
        src, tgt = TextEncoder(task.source_dictionary), TextEncoder(task.target_dictionary,
                                                                    side="target")
        return ContrastiveScorer(m, task, src, tgt, max_tokens=500)

    here = ga.translate_suite(scorer(model), suite, beam=2, max_len_b=20)
    calls = []
    build = task.build_generator
    task.build_generator = lambda *a, **k: checked_generator(build(*a, **k), calls)
    try:
        with OtherDeviceMode():
            there_model = copy.deepcopy(model).to(OTHER)
            there = ga.translate_suite(scorer(there_model), suite, beam=2, max_len_b=20)
    finally:
        del task.build_generator
    assert calls and sum(len(c) for c in calls) == len(suite.examples)
    assert there == here
    assert isinstance(there[0], str) and not torch.is_tensor(there[0])
