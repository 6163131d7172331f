"""ctx_fairseq.eval.scoring.significance: sacreBLEU's paired bootstrap (its own
implementation, the same p-values), over sentences and over documents; the
cases with nothing to test; bad input as one line, nothing written."""

import json
import random
import subprocess
import sys

import pytest

from ctx_fairseq.eval.scoring import significance as sig


def _data(n=200, docs=20, seed=0):
    rng = random.Random(seed)
    words = "a b c d e f g h i j k".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(n)]
    base = [" ".join(w if rng.random() < 0.5 else "x" for w in r.split()) for r in refs]
    system = [" ".join(w if rng.random() < 0.6 else "x" for w in r.split()) for r in refs]
    ids = [f"d{i * docs // n}" for i in range(n)]
    return base, system, refs, ids


def test_the_same_as_sacrebleu():
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    base, system, refs, ids = _data()
    got = sig.paired_bootstrap(base, system, [refs], ids, tokenize="none", n_samples=300)
    _, scores = PairedTest([("b", base), ("s", system)], {"BLEU": BLEU(tokenize="none")},
                           [refs], test_type="bs", n_samples=300)()
    assert got["sentences"]["p_value"] == scores["BLEU"][1].p_value
    assert got["sentences"]["system"] == scores["BLEU"][1].score
    # documents: each one segment (d-BLEU), resampled whole by sacreBLEU
    seg = sig.documents_as_segments(system, ids)
    assert len(seg) == 20 and seg[0] == " ".join(system[:10])
    _, dscores = PairedTest([("b", sig.documents_as_segments(base, ids)), ("s", seg)],
                            {"BLEU": BLEU(tokenize="none")},
                            [sig.documents_as_segments(refs, ids)], test_type="bs",
                            n_samples=300)()
    assert got["documents"]["p_value"] == dscores["BLEU"][1].p_value
    assert got["documents"]["segments"] == 20
    assert got["sentences"]["delta"] > 0 and got["sentences"]["p_value"] < 0.05


def test_nothing_to_test():
    base, system, refs, ids = _data(n=60, docs=6)
    few = sig.paired_bootstrap(base, system, [refs], ids, tokenize="none", n_samples=100)
    assert few["documents"]["p_value"] is None and "too few" in few["documents"]["note"]
    same = sig.paired_bootstrap(base, list(base), [refs], None, tokenize="none",
                                n_samples=100)
    assert same["sentences"]["p_value"] is None and "identical" in same["sentences"]["note"]
    assert same["documents"] is None


@pytest.mark.parametrize("edit, match", [
    (lambda b, s, r, i: (b, s[:-1], r, i), "the baseline has 10 hypotheses, the system 9"),
    (lambda b, s, r, i: (b, s, r[:-1], i), "reference 1 has 9 lines"),
    (lambda b, s, r, i: (b, s, r, i[:-1]), "9 document ids for 10 hypotheses"),
])
def test_bad_input(tmp_path, edit, match):
    b, s, r, i = edit(*_data(n=10, docs=2))
    files = {}
    for name, lines in (("b", b), ("s", s), ("r", r), ("i", i)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("".join(x + "\n" for x in lines))
    out = tmp_path / "out" / "paired.json"
    p = subprocess.run([sys.executable, "-m", "ctx_fairseq.eval.scoring.significance", "--baseline",
                        str(files["b"]), "--system", str(files["s"]), "--refs", str(files["r"]),
                        "--docids", str(files["i"]), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ctx-paired-bleu: error:") and match in last, p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists()


def test_cli_generate_output(tmp_path):
    base, system, refs, ids = _data(n=30, docs=3)
    for name, hyps in (("b", base), ("s", system)):
        with open(tmp_path / f"{name}.gen", "w") as f:
            for k, h in enumerate(hyps):
                f.write(f"S-{k}\tsrc\nT-{k}\t{refs[k]}\nH-{k}\t-1.0\t{h}\n")
    (tmp_path / "r.txt").write_text("".join(x + "\n" for x in refs))
    (tmp_path / "i.txt").write_text("".join(x + "\n" for x in ids))
    out = tmp_path / "paired.json"
    res = sig.cli_main(["--generate", "--baseline", str(tmp_path / "b.gen"), "--system",
                        str(tmp_path / "s.gen"), "--refs", str(tmp_path / "r.txt"),
                        "--docids", str(tmp_path / "i.txt"), "--tokenize", "none",
                        "--n-samples", "50", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["sentences"]["p_value"] == res["sentences"]["p_value"]
    assert got["sentences"]["segments"] == 30 and got["documents"]["p_value"] is None


def _segment_map(n, docs, size):
    """Segments of at most ``size`` consecutive sentences within each document."""
    out, per = [], n // docs
    for d in range(docs):
        for a in range(d * per, (d + 1) * per, size):
            out.append((a, min(size, (d + 1) * per - a)))
    return out


def test_segments_and_lowercase_are_sacrebleus_test_on_those_units():
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    base, system, refs, ids = _data()
    # the system's differences are in case only on half the sentences: lower-casing
    # must remove them from the test
    upper = [s.upper() if k % 2 else s for k, s in enumerate(system)]
    spans = _segment_map(200, 20, 3)  # 10 sentences per document: 3+3+3+1
    assert len(spans) == 80
    got = sig.paired_bootstrap(base, upper, [refs], ids, tokenize="none", n_samples=200,
                               segments=spans, lowercase=True)
    plain = sig.paired_bootstrap(base, system, [refs], ids, tokenize="none", n_samples=200,
                                 segments=spans)
    for unit in ("sentences", "documents", "segments"):
        assert got[unit]["system"] == pytest.approx(plain[unit]["system"])
        assert got[unit]["p_value"] == plain[unit]["p_value"]
        assert "case:lc" in got[unit]["signature"]
        assert "case:mixed" in plain[unit]["signature"]
    joined = sig.spans_as_segments(system, spans)
    assert joined[3] == system[9].strip() and joined[4] == " ".join(system[10:13])
    _, scores = PairedTest([("b", sig.spans_as_segments(base, spans)), ("s", joined)],
                           {"BLEU": BLEU(tokenize="none")},
                           [sig.spans_as_segments(refs, spans)], test_type="bs",
                           n_samples=200)()
    assert plain["segments"]["p_value"] == scores["BLEU"][1].p_value
    assert plain["segments"]["segments"] == 80
    cased = sig.paired_bootstrap(base, upper, [refs], None, tokenize="none", n_samples=50)
    assert cased["sentences"]["system"] < plain["sentences"]["system"] - 5


def test_segment_map_must_cover_every_sentence_once():
    base, system, refs, ids = _data(n=40, docs=4)
    spans = _segment_map(40, 4, 4)
    with pytest.raises(ValueError, match="exactly one segment"):
        sig.paired_bootstrap(base, system, [refs], ids, segments=spans[:-1], n_samples=10)
    few = sig.paired_bootstrap(base, system, [refs], ids, segments=_segment_map(40, 4, 10),
                               tokenize="none", n_samples=20)
    assert few["segments"]["p_value"] is None and "too few" in few["segments"]["note"]


@pytest.mark.parametrize("segments, docids, match", [
    ("0 1 2\n3 4\n", True, "in none: ids 5"),
    ("0 1 2 3 4 5 6\n7 8 9\n", True, "crosses documents"),
    ("0 1 2\n3 4 5 6 7 8 9\n", False, "needs --docids"),
])
def test_cli_segments_bad_map(tmp_path, segments, docids, match):
    base, system, refs, ids = _data(n=10, docs=2)
    for name, lines in (("b", base), ("s", system), ("r", refs), ("i", ids)):
        (tmp_path / f"{name}.txt").write_text("".join(x + "\n" for x in lines))
    (tmp_path / "map.txt").write_text(segments)
    out = tmp_path / "paired.json"
    argv = [sys.executable, "-m", "ctx_fairseq.eval.scoring.significance", "--baseline",
            str(tmp_path / "b.txt"), "--system", str(tmp_path / "s.txt"), "--refs",
            str(tmp_path / "r.txt"), "--segments", str(tmp_path / "map.txt"), "--out", str(out)]
    if docids:
        argv += ["--docids", str(tmp_path / "i.txt")]
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ctx-paired-bleu: error:") and match in last, p.stderr
    assert str(tmp_path / "map.txt") in last or not docids
    assert not out.exists()


def test_cli_segments(tmp_path, capsys):
    base, system, refs, ids = _data(n=200, docs=20)
    for name, lines in (("b", base), ("s", system), ("r", refs), ("i", ids)):
        (tmp_path / f"{name}.txt").write_text("".join(x + "\n" for x in lines))
    spans = _segment_map(200, 20, 5)
    (tmp_path / "map.txt").write_text(
        "".join(" ".join(str(i) for i in range(a, a + k)) + "\n" for a, k in spans))
    res = sig.cli_main(["--baseline", str(tmp_path / "b.txt"), "--system",
                        str(tmp_path / "s.txt"), "--refs", str(tmp_path / "r.txt"), "--docids",
                        str(tmp_path / "i.txt"), "--segments", str(tmp_path / "map.txt"),
                        "--tokenize", "none", "--n-samples", "50", "--lowercase"])
    assert res["segments"]["segments"] == 40 and res["lowercase"] is True
    printed = capsys.readouterr().out
    assert "over 40 segments: p = " in printed and "lower-cased" in printed
