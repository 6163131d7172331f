"""recipes/tvsub_zh_en/dp_report.py: the seed-and-sentence bootstrap (exact
in its degenerate cases, equal to ctx-dp-eval's sentence bootstrap with one
seed), and the report of synthetic per-seed work directories (per-seed and
mean figures computed by hand, the pooled McNemar test, sacreBLEU per seed);
dp_study.sh's options."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "recipes", "tvsub_zh_en")


def _module():
    sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location("dp_report", os.path.join(HERE, "dp_report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dpr = _module()


def _seed(ratio, units=20, den=5):
    """A seed whose every sentence has the same ratio (``den`` items each)."""
    return np.tile([ratio * den, den], (units, 1))


def test_seeds_alone_make_the_interval_when_sentences_agree():
    """Every sentence of a seed has its seed's ratio, so only the seed draw
    matters: the value is the mean of the seeds, the interval the
    percentiles of the mean of three seeds drawn with replacement from
    {0.2, 0.4, 0.6} (each extreme has probability 1/27 > 2.5 %)."""
    r = dpr.seed_sentence_bootstrap([_seed(0.2), _seed(0.4), _seed(0.6)], resamples=2000)
    assert r["value"] == pytest.approx(0.4, abs=1e-12)
    assert r["per_seed"] == pytest.approx([0.2, 0.4, 0.6], abs=1e-12)
    assert r["seed_sd"] == pytest.approx(0.2, abs=1e-12)
    assert r["interval"] == pytest.approx([0.2, 0.6], abs=1e-12)
    assert r["seeds"] == 3 and r["units"] == 20 and r["resamples_used"] == 2000
    # one seed, sentences that agree: no spread at all
    one = dpr.seed_sentence_bootstrap([_seed(0.3)])
    assert one["value"] == pytest.approx(0.3) and one["interval"] == pytest.approx([0.3, 0.3])
    assert "seed_sd" not in one


def test_one_seed_is_ctx_dp_eval_sentence_bootstrap():
    """With one seed the draws are ctx-dp-eval's (same generator, same
    first block of at most 100 resamples): the same interval."""
    from ctx_fairseq.eval.pronouns.dp_eval import bootstrap_interval

    rng = np.random.default_rng(3)
    den = rng.integers(1, 4, size=40)
    num = np.minimum(rng.integers(0, 4, size=40), den)
    r = dpr.seed_sentence_bootstrap([np.stack([num, den], 1)], resamples=100, seed=7)
    assert r["value"] == pytest.approx(num.sum() / den.sum(), abs=1e-12)
    assert r["interval"] == pytest.approx(bootstrap_interval(num, den, 100, 7, 0.95), abs=1e-12)


def test_paired_difference():
    """A model against itself: 0, a zero-width interval, p = 1; a model
    better on every sentence of every seed: the seeds' mean difference, p = 0."""
    a = [_seed(0.2), _seed(0.4), _seed(0.3)]
    same = dpr.seed_sentence_bootstrap(a, minus=a)
    assert same["value"] == 0 and same["interval"] == [0, 0] and same["p_value"] == 1
    b = [_seed(0.5), _seed(0.5), _seed(0.9)]
    d = dpr.seed_sentence_bootstrap(b, minus=a)
    assert d["per_seed"] == pytest.approx([0.3, 0.1, 0.6], abs=1e-12)
    assert d["value"] == pytest.approx(1 / 3, abs=1e-12)
    assert d["interval"] == pytest.approx([0.1, 0.6], abs=1e-12) and d["p_value"] == 0
    # undefined figures (no item drawn) are left out, not counted as 0
    sparse = np.zeros((50, 2))
    sparse[0] = (1, 1)
    r = dpr.seed_sentence_bootstrap([sparse], resamples=500)
    assert r["value"] == 1 and r["interval"] == [1, 1] and r["resamples_used"] < 500


# ---------------------------------------------------------- synthetic study
ZH = ["我 走 了", "走 了", "他 来", "来 了", "好 的"]
DP = ["我 走 了", "我 走 了", "他 来", "他 来 了", "好 的"]
REF = ["i left the house early today .", "i left the house early today .",
       "he came back home last night", "he came back home last night .",
       "ok , that is fine then ."]
# per seed: the hypotheses of the two sentences with a restored pronoun (lines 2 and 4)
_L, _I, _HE, _C = ("left the house early today .", "i left the house early today .",
                   "he came back home last night .", "came back home last night .")
HYPS = {"transformer": {1: (_L, _HE), 2: (_L, _HE), 3: (_L, _HE)},
        "context_aware": {1: (_I, _HE), 2: (_I, _HE), 3: (_L, _C)}}


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _study(root):
    prep = {"eval_split": "dev-episodes", "reported_on_chosen_set": False,
            "valid": {"documents": ["dev-SUB01"]},
            "test": {"documents": ["dev-SUB02"], "sentences": len(ZH)}}
    for s in (1, 2, 3):
        w = os.path.join(root, f"seed-{s}", "study")
        _write(os.path.join(w, "docs", "prep.json"), json.dumps(prep))
        _write(os.path.join(w, "docs", "test.zh"), "\n".join(ZH) + "\n")
        _write(os.path.join(w, "docs", "test.dp.zh"), "\n".join(DP) + "\n")
        _write(os.path.join(w, "docs", "test.ref0.en"), "\n".join(REF) + "\n")
        for m, by_seed in HYPS.items():
            h2, h4 = by_seed[s]
            hyps = [REF[0], h2, REF[2], h4, REF[4]]
            _write(os.path.join(w, "generate", f"{m}.txt"), "".join(
                f"S-{i}\t{ZH[i]}\nH-{i}\t-0.5\t{h}\nD-{i}\t-0.5\t{h}\n" for i, h in enumerate(hyps)))
        # McNemar's discordant items of the seed: only the transformer renders the
        # 3sg-m item in seed 3, only the context model the 1sg item in seeds 1 and 2
        comp = {k: {"items": 2, "only_a": 1 - HYPS["context_aware"][s][1].startswith("he"),
                    "only_b": int(HYPS["context_aware"][s][0].startswith("i")), "both": 0,
                    "mcnemar_p": 1.0, "paired_bootstrap": {"delta": 0.0, "interval": None,
                                                           "p_value": None}}
                for k in ("all", "without_neuter")}
        _write(os.path.join(w, "results", "context_aware", "dp_paired.json"),
               json.dumps({"comparison": comp}))
    return root


def test_report_of_synthetic_seeds(tmp_path):
    from sacrebleu.metrics import BLEU

    from ctx_fairseq.eval.pronouns.dp_eval import mcnemar_exact

    root = _study(str(tmp_path / "dp"))
    res = dpr.main(["--workdir", root, "--models", "transformer context_aware",
                    "--resamples", "200"])
    assert res["seeds"] == [1, 2, 3] and list(res["models"]) == ["sentence", "transformer",
                                                                  "context_aware"]
    assert res["dp_split"] == {"sentences": 5, "dp_sentences": 2, "items": 2}
    tr, ca = res["models"]["transformer"]["figures"], res["models"]["context_aware"]["figures"]
    # recall: the transformer renders the 3sg-m item only; the context model both in
    # seeds 1 and 2, none in seed 3
    assert tr["recall"]["per_seed"] == [0.5, 0.5, 0.5] and tr["recall"]["value"] == 0.5
    # (two sentences with items: a draw of one of them twice gives 0 or 1)
    assert tr["recall"]["interval"] == [0.0, 1.0]
    assert ca["recall"]["per_seed"] == [1.0, 1.0, 0.0]
    assert ca["recall"]["value"] == pytest.approx(2 / 3)
    assert ca["recall 1sg"]["per_seed"] == [1.0, 1.0, 0.0]
    assert tr["recall 3sg-m"]["per_seed"] == [1.0, 1.0, 1.0]
    lo, hi = ca["recall"]["interval"]
    assert 0 <= lo < 2 / 3 < hi <= 1
    # precision: every hypothesis pronoun is in the reference
    assert tr["precision_all"]["per_seed"] == [1.0, 1.0, 1.0]
    # BLEU per seed is sacreBLEU's corpus BLEU of that seed's translation
    for s, v in zip((1, 2, 3), ca["bleu"]["per_seed"]):
        h2, h4 = HYPS["context_aware"][s]
        want = BLEU(tokenize="none").corpus_score([REF[0], h2, REF[2], h4, REF[4]], [REF]).score
        assert v == pytest.approx(want, abs=1e-9)
    assert ca["bleu"]["value"] == pytest.approx(np.mean(ca["bleu"]["per_seed"]))
    assert 0 < ca["bleu"]["per_seed"][2] < ca["bleu"]["per_seed"][0] == pytest.approx(100)
    bleu_delta = res["models"]["context_aware"]["paired"]["pooled"]["bleu"]
    assert bleu_delta["per_seed"] == pytest.approx(
        [c - t for c, t in zip(ca["bleu"]["per_seed"], tr["bleu"]["per_seed"])], abs=1e-9)
    # paired: the recall difference per seed, pooled; McNemar of the summed discordant items
    pooled = res["models"]["context_aware"]["paired"]["pooled"]
    assert pooled["recall"]["per_seed"] == pytest.approx([0.5, 0.5, -0.5])
    assert pooled["recall"]["value"] == pytest.approx(1 / 6)
    mc = pooled["mcnemar all"]
    assert (mc["only_transformer"], mc["only_model"]) == (1, 2)
    assert mc["p"] == mcnemar_exact(1, 2) and mc["seeds"] == 3
    assert res["models"]["transformer"]["paired"] is None
    # (the sentence model, listed before the transformer, is compared with it too)
    assert res["models"]["sentence"]["paired"]["pooled"] == {}  # (no translation here)
    md = (tmp_path / "dp" / "results-dp.md").read_text()
    assert "chosen on dev-SUB01; figures reported on dev-SUB02" in md
    assert "expect wide intervals" in md
    assert "| context_aware | " in md and "66.7" in md
    assert json.loads((tmp_path / "dp" / "results-dp.json").read_text())["seeds"] == [1, 2, 3]


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no DIR/seed-N run"):
        dpr.main(["--workdir", str(tmp_path)])


def test_dp_study_options():
    script = os.path.join(HERE, "dp_study.sh")
    r = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--gpu" in r.stdout and "dp_report.py" in r.stdout
    r = subprocess.run(["bash", script], capture_output=True, text=True)
    assert r.returncode == 1 and "--raw DIR is required" in r.stderr
    r = subprocess.run(["bash", script, "--raw", "/nonexistent", "--report-only"],
                       capture_output=True, text=True,
                       env=dict(os.environ, SEEDS="x"))
    assert r.returncode == 1 and "SEEDS: x is not a number" in r.stderr
