"""ctx-make-pronoun-suite: the it -> er/sie/es heuristic on hand-written lines,
records in the split's units (plain and subword-nmt BPE), errors, and the
suite read back by ctx-score-contrastive's toy reader."""

import io
import json
import os

import pytest

from ctx_fairseq.eval.scoring import make_pronoun_suite as mps
from ctx_fairseq.eval.scoring.contrastive_suites import read_toy
from fairseq_cli_utils import run_main


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def run(argv, capsys):
    return run_main(mps.cli_main, argv, capsys)


def find(src, tgt):
    return mps.find_pronoun(src.split(), tgt.split())


@pytest.mark.parametrize("src,tgt,expected", [
    ("the cat ? it is black .", "die Katze ? sie ist schwarz .", (3, "")),
    ("It works .", "Er funktioniert .", (0, "")),
    ("it works .", "er funktioniert .", (0, "")),
    ("I see it .", "ich sehe ihn .", (2, "")),
    ('" It rains .', '" Es regnet .', (1, "")),
    ("It is big .", "Sie ist groß .", (0, "")),          # first-word Sie, no 'you': 'she/it'
    ("I think you know it works .", "ich glaube , Sie wissen , dass es funktioniert .",
     (7, "")),  # the polite Sie inside the sentence is not counted
    ("you know it works .", "Sie funktioniert , wissen Sie .", (None, "ambiguous_sie")),
    ("it is here .", "das ist hier .", (None, "no_target_pronoun")),
    ("it is here and it stays .", "es ist hier und bleibt .", (None, "several_it")),
    ("he said it works .", "er sagte , es funktioniert .", (None, "other_source_pronoun")),
    ("They say it works .", "sie sagen , es funktioniert .", (None, "other_source_pronoun")),
    ("it gives it to me .", "es gibt es mir .", (None, "several_it")),
    ("it belongs to the house .", "es gehört zu ihm .", (None, "several_target_pronouns")),
    ("I gave it water .", "ich gab ihm Wasser .", (None, "ihm")),
    ("the dog barks .", "der Hund bellt .", (None, "no_it")),
    ("IT is everywhere .", "ES ist überall .", (None, "no_target_pronoun")),  # odd casing
])
def test_heuristic(src, tgt, expected):
    assert find(src, tgt) == expected


def test_candidates_keep_capitalisation():
    assert mps.candidates_for("er") == ["sie", "es"]
    assert mps.candidates_for("Sie") == ["Er", "Es"]
    assert mps.candidates_for("Es") == ["Er", "Sie"]
    assert mps.candidates_for("ihn") == ["sie", "es"]


SRC = ["The lamp is old .", "It is broken .", "We like the dog .", "I bought it yesterday .",
       "It is nice .", "Nothing here ."]
TGT = ["Die Lampe ist alt .", "Sie ist kaputt .", "Wir mögen den Hund .",
       "ich habe ihn gestern gekauft .", "es ist schön .", "Nichts hier ."]
IDS = ["d1", "d1", "d2", "d2", "d3", "d3"]


def test_plain_files(tmp_path, capsys):
    src, tgt = write(tmp_path / "t.en", SRC), write(tmp_path / "t.de", TGT)
    ids, out = write(tmp_path / "t.docids", IDS), str(tmp_path / "o" / "suite.jsonl")
    code, stdout, err = run(["--src", src, "--tgt", tgt, "--docids", ids, "--out", out], capsys)
    assert code == 0, err
    assert "3 records from 6 lines (3 documents)" in stdout
    assert "it:es 1, it:ihn 1, it:sie 1" in stdout and "3 no 'it' in the source" in stdout
    with open(out, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    assert [r["id"] for r in recs] == [1, 3, 4]
    r = recs[0]
    assert r == {"id": 1, "doc_id": "d1", "sent_index": 1, "phenomenon": "it:sie",
                 "distance": None, "antecedent_id": None, "src": "It is broken .",
                 "ref": "Sie ist kaputt .",
                 "contrastive": ["Er ist kaputt .", "Es ist kaputt ."], "word": "Sie",
                 "contrastive_words": ["Er", "Es"], "word_index": 0}
    assert recs[1]["contrastive"] == ["ich habe sie gestern gekauft .",
                                      "ich habe es gestern gekauft ."]
    assert (recs[1]["sent_index"], recs[1]["word_index"]) == (1, 2)
    assert (recs[2]["doc_id"], recs[2]["sent_index"]) == ("d3", 0)
    suite = read_toy(out)  # what ctx-score-contrastive --format toy reads
    assert [e.corpus_line for e in suite.examples] == [1, 3, 4]
    assert all(e.distance is None for e in suite.examples)
    assert [e.category for e in suite.examples] == ["it:sie", "it:ihn", "it:es"]


def _learn_codes(tmp_path, text, merges=60):
    from subword_nmt.learn_bpe import learn_bpe

    codes = tmp_path / "codes"
    with open(codes, "w", encoding="utf-8") as out:
        learn_bpe(io.StringIO("\n".join(text) + "\n"), out, merges)
    return str(codes)


def test_bpe_units(tmp_path, capsys):
    """Records are in the BPE units of the split; candidates are segmented with
    the codes, exactly as apply-bpe segments the word."""
    from subword_nmt.apply_bpe import BPE

    codes = _learn_codes(tmp_path, SRC + TGT)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    seg = [bpe.process_line(x) for x in SRC], [bpe.process_line(x) for x in TGT]
    assert any("@@" in x for x in seg[0] + seg[1])  # the test means something
    src, tgt = write(tmp_path / "b.en", seg[0]), write(tmp_path / "b.de", seg[1])
    ids, out = write(tmp_path / "b.docids", IDS), str(tmp_path / "suite.jsonl")
    code, _, err = run(["--src", src, "--tgt", tgt, "--docids", ids, "--bpe-codes", codes,
                        "--out", out], capsys)
    assert code == 0, err
    with open(out, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    assert [r["id"] for r in recs] == [1, 3, 4]
    for r in recs:
        assert r["src"] == seg[0][r["id"]] and r["ref"] == seg[1][r["id"]]
        words = TGT[r["id"]].split()
        k = [w.lower() for w in words].index(r["word"].lower())
        for c, cw in zip(r["contrastive"], r["contrastive_words"]):
            assert c == bpe.process_line(" ".join(words[:k] + [cw] + words[k + 1:]))
        unit = r["ref"].split()[r["word_index"]]  # the pronoun's first unit
        assert r["word"].startswith(unit.replace("@@", ""))
    # BPE'd text without the codes, and the wrong codes, are errors
    code, _, err = run(["--src", src, "--tgt", tgt, "--docids", ids, "--out", out + "2"], capsys)
    assert code == 2 and "give the codes with --bpe-codes" in err
    (tmp_path / "other").mkdir()
    other = _learn_codes(tmp_path / "other", ["zebra yak walrus"] * 3, merges=3)
    code, _, err = run(["--src", src, "--tgt", tgt, "--docids", ids, "--bpe-codes", other,
                        "--out", out + "3"], capsys)
    assert code == 2 and "expected the codes the split was segmented with" in err
    assert not os.path.exists(out + "2") and not os.path.exists(out + "3")


def test_errors_write_nothing(tmp_path, capsys):
    src, tgt = write(tmp_path / "t.en", SRC), write(tmp_path / "t.de", TGT)
    ids = write(tmp_path / "t.docids", IDS)
    out_dir = tmp_path / "o"
    out = str(out_dir / "s.jsonl")

    def fails(argv, *fragments):
        code, stdout, err = run(argv + ["--out", out], capsys)
        assert code == 2, (stdout, err)
        assert err.startswith("ctx-make-pronoun-suite: error: ")
        for frag in fragments:
            assert frag in err, (frag, err)
        assert not out_dir.exists() or os.listdir(out_dir) == []

    # no sentence fits: an error, not an empty file
    none = write(tmp_path / "n.en", ["The dog barks .", "it is here ."])
    none_de = write(tmp_path / "n.de", ["Der Hund bellt .", "das ist hier ."])
    none_ids = write(tmp_path / "n.docids", ["a", "a"])
    fails(["--src", none, "--tgt", none_de, "--docids", none_ids], "no sentence of",
          "1 no 'it' in the source", "1 no er/sie/es/ihn/ihm in the target")
    short = write(tmp_path / "short.docids", IDS[:-1])
    fails(["--src", src, "--tgt", tgt, "--docids", short], "line counts differ",
          "has 6", "5; expected")
    bad_ids = write(tmp_path / "bad.docids", ["d1", "d2", "d1", "d3", "d3", "d3"])
    fails(["--src", src, "--tgt", tgt, "--docids", bad_ids], "document d1 reappears")
    fails(["--src", str(tmp_path / "missing.en"), "--tgt", tgt, "--docids", ids],
          "cannot read")
    empty = write(tmp_path / "e.en", [])
    fails(["--src", empty, "--tgt", empty, "--docids", ids], "e.en: empty file")
