"""The sentence-level recipes of the DC paper (Ampomah et al. 2021) and the
hybrid-attention paper (Xu et al. 2019): recipes/{iwslt14_es_en, iwslt14_ro_en,
iwslt15_en_vi, iwslt15_fr_en, wmt14_en_de, wat17_ja_en}/run.sh and their shared
library recipes/lib/steps_sentence.sh.

* every recipe passes ``bash -n``;
* ``--smoke --raw DIR`` on a few lines written here (the toy corpus's sentences
  in each corpus's raw layout), without network: every local step runs, BLEU
  comes with its sacreBLEU signature, the analyses write their tables and PNGs;
  a second run skips every finished step;
* offline full mode stops at the download step with a clear message and
  leaves nothing half-written.

One recipe's smoke run is in the default suite (with two models and one
direction, about a minute); every recipe's full smoke run is ``-m slow``.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = ["iwslt14_es_en", "iwslt14_ro_en", "iwslt15_en_vi", "iwslt15_fr_en", "wmt14_en_de",
           "wat17_ja_en"]
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"


# ---------------------------------------------------------------- sample data


def toy_pairs(n=48, seed=1):
    """``n`` distinct (source, target) sentence pairs of the toy corpus."""
    import tempfile

    from ctx_fairseq.data.toy_corpus import make_toy_corpus

    with tempfile.TemporaryDirectory() as d:
        make_toy_corpus(d, docs=40, sents_per_doc=8, max_distance=3, seed=seed,
                        valid_docs=2, test_docs=2)
        with open(os.path.join(d, "train.src"), encoding="utf-8") as f:
            src = f.read().splitlines()
        with open(os.path.join(d, "train.tgt"), encoding="utf-8") as f:
            tgt = f.read().splitlines()
    seen, pairs = set(), []
    for s, t in zip(src, tgt):
        if s not in seen:
            seen.add(s)
            pairs.append((s, t))
        if len(pairs) == n:
            return pairs
    raise AssertionError(f"the toy corpus has fewer than {n} distinct sentences")


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def _split(pairs, n_valid=6, n_test=6):
    return pairs[: -n_valid - n_test], pairs[-n_valid - n_test: -n_test], pairs[-n_test:]


def _xml(path, pairs, side, lang, talk=1):
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
             f'<srcset setid="x" srclang="{lang}">', f'<doc docid="{talk}" genre="lectures">',
             f"<url>http://www.ted.com/talks/{talk}</url>", "<talkid>1</talkid>"]
    for i, p in enumerate(pairs, 1):
        text = p[side].replace("&", "&amp;")
        lines.append(f'<seg id="{i}"> {text} </seg>')
    lines += ["</doc>", "</srcset>", "</mteval>"]
    _write(path, lines)


def _tags(path, pairs, side):
    lines = []
    for i, p in enumerate(pairs):
        if i % 10 == 0:
            lines += [f"<url>http://www.ted.com/talks/{i}</url>", "<keywords>talks</keywords>",
                      f"<talkid>{i}</talkid>", "<title>A talk</title>",
                      "<description>TED talk</description>"]
        lines.append(p[side])
    _write(path, lines)


def write_wit3(root, pair, year, valid_sets, test_sets, pairs):
    """A WIT3 release as its archives extract: PAIR/train.tags.PAIR.L and
    PAIR/IWSLT<year>.TED.SET.PAIR.L.xml (the test sets in a second tree)."""
    l1, l2 = pair.split("-")
    train, valid, test = _split(pairs)
    _tags(os.path.join(root, pair, f"train.tags.{pair}.{l1}"), train, 0)
    _tags(os.path.join(root, pair, f"train.tags.{pair}.{l2}"), train, 1)
    for sets, part, sub in ((valid_sets, valid, pair), (test_sets, test, f"test/{pair}")):
        chunk = max(1, len(part) // len(sets))
        for k, s in enumerate(sets):
            piece = part[k * chunk:(k + 1) * chunk] if k < len(sets) - 1 else part[k * chunk:]
            for side, lang in ((0, l1), (1, l2)):
                _xml(os.path.join(root, sub, f"IWSLT{year}.TED.{s}.{pair}.{lang}.xml"), piece, side,
                     lang, talk=k + 1)


def write_stanford_en_vi(root, pairs):
    train, valid, test = _split(pairs)
    for name, part in (("train", train), ("tst2012", valid), ("tst2013", test)):
        _write(os.path.join(root, f"{name}.en"), [p[0] for p in part])
        _write(os.path.join(root, f"{name}.vi"), [p[1] for p in part])


def _sgm(path, pairs, side, kind):
    lines = [f'<{kind}set setid="newstest2014" srclang="any">', '<doc sysid="ref" docid="1" genre="news" origlang="en">']
    lines += [f'<seg id="{i}">{p[side]}</seg>' for i, p in enumerate(pairs, 1)]
    lines += ["</doc>", f"</{kind}set>"]
    _write(path, lines)


def write_probing(root, sentences):
    """Two SentEval-format probing tasks (split, label, sentence)."""
    sl, bs = [], []
    for i, s in enumerate(sentences):
        split = "tr" if i % 5 < 3 else ("va" if i % 5 == 3 else "te")
        sl.append(f"{split}\t{'short' if len(s.split()) < 6 else 'long'}\t{s}")
        words = s.split()
        if i % 2 and len(words) > 3:
            words[1], words[2] = words[2], words[1]
        bs.append(f"{split}\t{'I' if i % 2 and len(s.split()) > 3 else 'O'}\t{' '.join(words)}")
    _write(os.path.join(root, "probing", "sentence_length.txt"), sl)
    _write(os.path.join(root, "probing", "bigram_shift.txt"), bs)


def write_wmt14(root, pairs):
    """WMT14 en-de as the statmt archives extract, plus SentEval's probing files.
    The validation sentences repeat training sentences, so that every subword
    piece of the validation source is in the (separate) source dictionary:
    the gate-by-POS analysis joins pieces into words, and a piece mapped to
    <unk> would lose its continuation marker."""
    train, valid, test = _split(pairs)
    valid = train[:len(valid)]
    thirds = [train[i::3] for i in range(3)]
    for part, (sub, name) in zip(thirds, (("training", "europarl-v7.de-en"), ("", "commoncrawl.de-en"),
                                          ("training", "news-commentary-v9.de-en"))):
        _write(os.path.join(root, sub, f"{name}.en"), [p[0] for p in part])
        _write(os.path.join(root, sub, f"{name}.de"), [p[1] for p in part])
    _write(os.path.join(root, "dev", "newstest2013.en"), [p[0] for p in valid])
    _write(os.path.join(root, "dev", "newstest2013.de"), [p[1] for p in valid])
    _sgm(os.path.join(root, "test-full", "newstest2014-deen-src.en.sgm"), test, 0, "src")
    _sgm(os.path.join(root, "test-full", "newstest2014-deen-ref.de.sgm"), test, 1, "ref")
    write_probing(root, [p[0] for p in train])
    return valid


def write_aspec(root, pairs):
    """ASPEC-JE's layout; the 'Japanese' side is the toy target text (already
    segmented: the smoke test runs with --ja-segmented)."""
    train, valid, test = _split(pairs)
    half = len(train) // 2
    for name, part in (("train-1", train[:half]), ("train-2", train[half:])):
        _write(os.path.join(root, "ASPEC-JE", "train", f"{name}.txt"),
               [f"0.9 ||| A-{i} ||| {i} ||| {t} ||| {s}" for i, (s, t) in enumerate(part)])
    for name, part in (("dev", valid), ("test", test)):
        _write(os.path.join(root, "ASPEC-JE", name, f"{name}.txt"),
               [f"B-{i} ||| {i} ||| {t} ||| {s}" for i, (s, t) in enumerate(part)])


def write_sample(recipe, root, pairs):
    """The raw layout of ``recipe`` (see its README) with ``pairs``; returns
    extra environment for the run."""
    env = {}
    if recipe == "iwslt14_es_en":
        write_wit3(root, "es-en", 14, ["tst2010", "tst2011", "tst2012", "dev2010"], ["tst2014"], pairs)
    elif recipe == "iwslt14_ro_en":
        write_wit3(root, "ro-en", 14, ["tst2010", "tst2011", "tst2012", "dev2010"], ["tst2014"], pairs)
    elif recipe == "iwslt15_fr_en":
        write_wit3(root, "fr-en", 15, ["tst2013"], ["tst2014", "tst2015"], pairs)
    elif recipe == "iwslt15_en_vi":
        write_stanford_en_vi(root, pairs)
    elif recipe == "wmt14_en_de":
        valid = write_wmt14(root, pairs)
        # one Universal POS tag per word of the validation source (words only: the
        # toy text tokenises to itself)
        tags = [" ".join("NOUN" if len(w) > 3 else ("DET" if w in ("a", "the") else "X")
                         for w in p[0].split()) for p in valid]
        _write(os.path.join(root, "valid.en.upos"), tags)
        env["POS_TAGS"] = os.path.join(root, "valid.en.upos")
    elif recipe == "wat17_ja_en":
        write_aspec(root, pairs)
    else:
        raise ValueError(recipe)
    return env


# ---------------------------------------------------------------- running


def run_recipe(recipe, args, env_extra=None, timeout=1800):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHON": sys.executable,
                "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")})
    # no network: any download fails at once instead of waiting for a timeout
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env[var] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    env.update(env_extra or {})
    return subprocess.run(["bash", os.path.join(REPO, "recipes", recipe, "run.sh"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _check(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stderr ---\n{proc.stderr[-6000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"


def _done(work):
    return sorted(os.listdir(os.path.join(work, ".done")))


def check_bleu(work, direction, model, tok_bleu):
    d = os.path.join(work, "results", direction, model)
    with open(os.path.join(d, "bleu.txt"), encoding="utf-8") as f:
        text = f.read()
    assert "sacreBLEU" in text and "signature: " + SIGNATURE in text, text
    with open(os.path.join(d, "bleu.json"), encoding="utf-8") as f:
        res = json.load(f)
    assert res["sacrebleu"]["signature"].startswith(SIGNATURE)
    assert 0.0 <= res["sacrebleu"]["score"] <= 100.0
    with open(os.path.join(d, "hyp.detok"), encoding="utf-8") as f:
        n_hyp = len(f.read().splitlines())
    with open(os.path.join(work, "text", "test." + direction.split("-")[1]), encoding="utf-8") as f:
        assert n_hyp == len(f.read().splitlines()) == res["sentences"]
    if tok_bleu:
        assert res["tokenized_bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none")
        assert "tokenized BLEU (" in text
    else:
        assert res["tokenized_bleu"] is None and "tokenized BLEU" not in text


def _png(path):
    assert os.path.getsize(path) > 1000, path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", path


def no_partial_files(work):
    left = [p for p in glob.glob(os.path.join(work, "**", "*"), recursive=True)
            if ".part" in os.path.basename(p) or p.endswith("raw.part")]
    assert not left, left


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("recipe", RECIPES)
def test_bash_syntax(recipe):
    for path in (os.path.join(REPO, "recipes", recipe, "run.sh"),
                 os.path.join(REPO, "recipes", "lib", "steps_sentence.sh")):
        proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    with open(os.path.join(REPO, "recipes", recipe, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "--smoke" in readme and "Sec." in readme


@pytest.mark.parametrize("recipe", RECIPES)
def test_offline_full_mode_stops_at_download(recipe, tmp_path):
    work = str(tmp_path / "w")
    proc = run_recipe(recipe, ["--workdir", work], timeout=120)
    assert proc.returncode != 0
    err = proc.stderr
    assert "step download failed" in err, err
    if recipe == "wat17_ja_en":
        assert "licence" in err and "--raw" in err, err
    else:
        assert "cannot download" in err and "--raw DIR" in err, err
    assert not os.path.exists(os.path.join(work, ".done", "download"))
    assert not os.path.exists(os.path.join(work, "raw"))
    assert not os.listdir(os.path.join(work, "download")) if os.path.isdir(
        os.path.join(work, "download")) else True
    no_partial_files(work)


def test_smoke_without_raw_is_an_error(tmp_path):
    proc = run_recipe("iwslt14_es_en", ["--smoke", "--workdir", str(tmp_path / "w")], timeout=60)
    assert proc.returncode != 0 and "--smoke runs the local steps only" in proc.stderr


def test_unknown_model_is_an_error(tmp_path):
    raw = str(tmp_path / "raw")
    write_sample("iwslt14_es_en", raw, toy_pairs())
    proc = run_recipe("iwslt14_es_en", ["--smoke", "--raw", raw, "--workdir", str(tmp_path / "w")],
                      {"MODELS": "transformer nope"}, timeout=60)
    assert proc.returncode != 0 and "MODELS: unknown model 'nope'" in proc.stderr, proc.stderr


def test_smoke_iwslt14_es_en_reduced_and_rerun(tmp_path):
    """The default suite's smoke run: two models, one direction (the others: -m slow)."""
    raw = str(tmp_path / "raw")
    write_sample("iwslt14_es_en", raw, toy_pairs())
    work_root = str(tmp_path / "w")
    env = {"MODELS": "transformer enc-dc", "DIRECTIONS": "es-en"}
    proc = run_recipe("iwslt14_es_en", ["--smoke", "--raw", raw, "--workdir", work_root], env)
    _check(proc)
    work = os.path.join(work_root, "smoke")
    for model in ("transformer", "enc-dc"):
        check_bleu(work, "es-en", model, tok_bleu=True)
    by_len = glob.glob(os.path.join(work, "analysis", "by_length", "es-en", "bleu_by_length.*"))
    assert sorted(os.path.splitext(p)[1] for p in by_len) == [".json", ".md", ".png"]
    _png(os.path.join(work, "analysis", "by_length", "es-en", "bleu_by_length.png"))
    with open(os.path.join(work, "results", "summary.md"), encoding="utf-8") as f:
        summary = f.read()
    assert "Smoke run" in summary and "| es-en | enc-dc | Enc-DC |" in summary
    # the paired bootstrap against the transformer: a p for enc-dc, - for the transformer
    with open(os.path.join(work, "results", "es-en", "enc-dc", "paired.json"),
              encoding="utf-8") as f:
        paired = json.load(f)
    assert paired["baseline_file"].endswith(os.path.join("es-en", "transformer", "hyp.detok"))
    row = next(line for line in summary.splitlines() if line.startswith("| es-en | enc-dc |"))
    p_cell = row.rstrip(" |").rsplit("|", 1)[1].strip()
    assert p_cell not in ("-", "not measured") and (p_cell in ("n/a", "<0.001")
                                                    or 0 <= float(p_cell) <= 1)
    row = next(line for line in summary.splitlines() if line.startswith("| es-en | transformer |"))
    assert row.rstrip(" |").rsplit("|", 1)[1].strip() == "-"
    # metadata lines of train.tags are not training text; XML entities unescaped
    with open(os.path.join(work, "text", "train.es"), encoding="utf-8") as f:
        train = f.read()
    assert "<url>" not in train and "<talkid>" not in train
    done = _done(work)
    stamp = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(work, "results", "*", "*", "*"))}
    proc2 = run_recipe("iwslt14_es_en", ["--smoke", "--raw", raw, "--workdir", work_root], env)
    _check(proc2)
    assert _done(work) == done
    for name in done:
        assert f"skip {name} (done" in proc2.stderr, name
    assert "step " not in proc2.stderr.replace("step download", "")
    assert {p: os.path.getmtime(p) for p in stamp} == stamp
    no_partial_files(work)
    # the markers record the resolved options; other settings stop the re-run
    with open(os.path.join(work, ".done", "train-es-en-enc-dc"), encoding="utf-8") as f:
        marker = f.read().splitlines()
    for line in ("arg.0=sent_train", "arg.3=bin", "arg.4=--arch", "arg.5=transformer_dc_iwslt",
                 "SMOKE=1", "reads=TRAIN_EXTRA", "TRAIN_EXTRA=", "SENT_TOKENIZER_es=moses"):
        assert line in marker, (line, marker)
    # the raw directory is recorded by the data steps only, GEN_EXTRA by the decoding steps
    assert not any(x.startswith(("RAW=", "GEN_EXTRA=")) for x in marker), marker
    with open(os.path.join(work, ".done", "text"), encoding="utf-8") as f:
        assert f"RAW={os.path.realpath(raw)}" in f.read().splitlines()
    with open(os.path.join(work, ".done", "bpe"), encoding="utf-8") as f:
        assert "arg.1=300" in f.read().splitlines()
    proc3 = run_recipe("iwslt14_es_en", ["--smoke", "--raw", raw, "--workdir", work_root],
                       dict(env, TRAIN_EXTRA="--clip-norm 0.1"))
    # a new TRAIN_EXTRA stops at the first training step (the data steps are kept)
    assert proc3.returncode == 1
    assert "skip bin (done" in proc3.stderr, proc3.stderr
    assert re.search(r"step train-\S+ was done with other settings than this run's", proc3.stderr)
    assert "TRAIN_EXTRA: done with '', now '--clip-norm 0.1'" in proc3.stderr
    assert _done(work) == done
    # a new GEN_EXTRA: the first decoding step (the training steps are kept)
    proc4 = run_recipe("iwslt14_es_en", ["--smoke", "--raw", raw, "--workdir", work_root],
                       dict(env, GEN_EXTRA="--nbest 1"))
    assert proc4.returncode == 1
    assert re.search(r"skip train-\S+ \(done", proc4.stderr)
    assert re.search(r"step test-\S+ was done with other settings than this run's", proc4.stderr)
    assert "GEN_EXTRA: done with '', now '--nbest 1'" in proc4.stderr
    assert _done(work) == done


def _smoke_full(recipe, tmp_path, extra_args=()):
    raw = str(tmp_path / "raw")
    env = write_sample(recipe, raw, toy_pairs())
    work_root = str(tmp_path / "w")
    proc = run_recipe(recipe, ["--smoke", "--raw", raw, "--workdir", work_root, *extra_args], env)
    _check(proc)
    work = os.path.join(work_root, "smoke")
    proc2 = run_recipe(recipe, ["--smoke", "--raw", raw, "--workdir", work_root, *extra_args], env)
    _check(proc2)
    for name in _done(work):
        assert f"skip {name} (done" in proc2.stderr, name
    no_partial_files(work)
    return work


@pytest.mark.slow
@pytest.mark.parametrize("recipe,pair,tok_bleu", [
    ("iwslt14_es_en", "es-en", True), ("iwslt14_ro_en", "ro-en", True),
    ("iwslt15_fr_en", "fr-en", True), ("iwslt15_en_vi", "en-vi", False)])
def test_smoke_dc_iwslt(recipe, pair, tok_bleu, tmp_path):
    work = _smoke_full(recipe, tmp_path)
    l1, l2 = pair.split("-")
    for direction in (f"{l1}-{l2}", f"{l2}-{l1}"):
        for model in ("transformer", "enc-dc", "dec-dc", "full-dc"):
            check_bleu(work, direction, model, tok_bleu)
        _png(os.path.join(work, "analysis", "by_length", direction, "bleu_by_length.png"))


@pytest.mark.slow
def test_smoke_wmt14_en_de(tmp_path):
    work = _smoke_full("wmt14_en_de", tmp_path)
    for model in ("dc-transformer", "dc-enc", "dc-dec", "dc-full", "dc-enc-f3", "dc-enc-l1-1",
                  "hyb-transformer", "hyb-local", "hyb-gate"):
        check_bleu(work, "en-de", model, tok_bleu=True)
    a = os.path.join(work, "analysis")
    for png in ("by_length/en-de/bleu_by_length.png", "dc_jsd/dc_jsd.png", "kernel_size_bleu.png",
                "probe/dc-transformer/probe.png", "probe/dc-enc/probe.png",
                "probe/hyb-gate/probe.png", "hybrid_gates/hybrid_gates_by_layer.png",
                "hybrid_gates_pos/hybrid_gates_by_pos.png",
                "window_sweep/hybrid_window_sweep.png"):
        _png(os.path.join(a, png))
    # the window sweep: each window trained through train() and scored as the
    # recipe scores its models, against the validation reference files
    with open(os.path.join(a, "window_sweep", "hybrid_window_sweep.json"), encoding="utf-8") as f:
        sweep = json.load(f)
    assert [r["window"] for r in sweep["runs"]] == [1, 2]
    assert sweep["sacrebleu_signature"].startswith(SIGNATURE)
    assert "tok:none" in sweep["tokenized_bleu_signature"] and sweep["tokenized_bleu_label"]
    for r in sweep["runs"]:
        run = os.path.join(a, "window_sweep", f"m{r['window']}")
        with open(os.path.join(run, "bleu.json"), encoding="utf-8") as f:
            scored = json.load(f)
        assert r["sacrebleu"] == scored["sacrebleu"]["score"]
        assert r["tokenized_bleu"] == scored["tokenized_bleu"]["score"]
        assert r["reference"] == os.path.join(work, "text", "valid.de")
        assert r["tokenized_reference"] == os.path.join(work, "tok", "valid.de")
        assert os.path.exists(os.path.join(a, "window_sweep", "ckpt", f"m{r['window']}", "train.done"))
    with open(os.path.join(a, "window_sweep", "hybrid_window_sweep.md"), encoding="utf-8") as f:
        assert sweep["sacrebleu_signature"] in f.read()
    with open(os.path.join(work, "results", "summary.md"), encoding="utf-8") as f:
        summary = f.read()
    assert "## Probing" in summary and "Mean test accuracy % per group" in summary
    assert "Enc-DC by CNN kernel size f" in summary and "| en-de | dc-enc-f3 | Enc-DC-f3 | dc-wmt | 3 |" in summary
    assert "Enc-DC by DC encoder layers" in summary and "| en-de | dc-enc-l1-1 | Enc-DC-[1-1] | dc-wmt | 1-1 |" in summary
    assert "| en-de | hyb-gate | HYBRID-Gate | hyb-wmt |" in summary


@pytest.mark.slow
def test_smoke_wat17_ja_en(tmp_path):
    work = _smoke_full("wat17_ja_en", tmp_path, ["--ja-segmented"])
    for model in ("hyb-transformer", "hyb-local", "hyb-gate"):
        check_bleu(work, "ja-en", model, tok_bleu=True)
    _png(os.path.join(work, "analysis", "hybrid_gates", "hybrid_gates_by_layer.png"))


def test_wat17_without_segmenter_stops_clearly(tmp_path):
    """KyTea is not installed here: without --ja-segmented the segmentation step
    stops with a message (never skipped silently)."""
    import shutil

    if shutil.which("kytea"):
        pytest.skip("KyTea is installed")
    raw = str(tmp_path / "raw")
    write_sample("wat17_ja_en", raw, toy_pairs())
    proc = run_recipe("wat17_ja_en", ["--smoke", "--raw", raw, "--workdir", str(tmp_path / "w")],
                      timeout=120)
    assert proc.returncode != 0
    assert "KyTea" in proc.stderr and "--ja-segmented" in proc.stderr, proc.stderr
    assert "step tok failed" in proc.stderr
    assert not glob.glob(str(tmp_path / "w" / "smoke" / "tok" / "*.ja"))
