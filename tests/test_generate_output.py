"""Reading fairseq-generate output."""

import pytest

from ctx_fairseq.generate_output import corpus_bleu, read_generate_output

LOG = """S-1\tb c
T-1\tx y
H-1\t-0.2\tx y
D-1\t-0.2\tx y
P-1\t-0.1 -0.1 -0.1
H-1\t-0.9\tx z
D-1\t-0.9\tx z
S-0\ta
T-0\tw
H-0\t-0.1\tw
D-0\t-0.1\tw
Generate test with beam=2: BLEU4 = 100.00
"""


def test_sorted_by_id_and_best_of_nbest(tmp_path):
    p = tmp_path / "gen.txt"
    p.write_text(LOG)
    g = read_generate_output(str(p))
    assert g.ids == [0, 1] and g.sources == ["a", "b c"]
    assert g.hypotheses == ["w", "x y"] and g.references == ["w", "x y"]
    assert g.detokenized == ["w", "x y"]  # D- lines, best of the n-best too
    assert corpus_bleu(g.hypotheses, g.references) == 0.0  # no 4-grams in 1-2 token lines
    long = ["the cat sat on the mat today", "a dog ran in the park again"]
    assert corpus_bleu(long, long) == pytest.approx(100.0)
    assert 0.0 < corpus_bleu([long[0], "a dog ran in a park again"], long) < 100.0


def test_errors_name_the_file(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("no hypotheses here\n")
    with pytest.raises(ValueError, match="empty.txt: no hypotheses"):
        read_generate_output(str(p))
    q = tmp_path / "broken.txt"
    q.write_text("H-3\t-0.1\tw\n")
    with pytest.raises(ValueError, match="broken.txt: sentence id 3"):
        read_generate_output(str(q))


def test_detokenized_lines_and_optional_references(tmp_path):
    p = tmp_path / "gen.txt"
    p.write_text("S-0\ta\nH-0\t-0.1\tthe cat &apos;s\nD-0\t-0.1\tthe cat's\n"
                 "S-1\tb\nH-1\t-0.1\tx\nD-1\t-0.1\tx\n")
    g = read_generate_output(str(p), need_references=False)
    assert g.hypotheses == ["the cat &apos;s", "x"] and g.detokenized == ["the cat's", "x"]
    assert g.references is None
    with pytest.raises(ValueError, match="gen.txt: sentence id 0 has a hypothesis but no S-/T-"):
        read_generate_output(str(p))  # references needed by default
    q = tmp_path / "old.txt"  # no D- lines at all (older fairseq)
    q.write_text("S-0\ta\nT-0\tw\nH-0\t-0.1\tw\n")
    assert read_generate_output(str(q)).detokenized is None


def test_duplicates_and_partial_lines_are_errors(tmp_path):
    from ctx_fairseq.generate_output import NoHypothesesError

    def fails(text, message):
        p = tmp_path / "g.txt"
        p.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_generate_output(str(p))

    block = "S-{0}\ta\nT-{0}\tw\nH-{0}\t-0.1\tw\nD-{0}\t-0.1\tw\n"
    # two runs concatenated: id 0 comes back after id 1
    fails(block.format(0) + block.format(1) + block.format(0),
          r"g.txt:9: sentence id 0 appears again \(its lines began at line 1")
    fails("S-0\ta\nS-0\tb\nT-0\tw\nH-0\t-0.1\tw\n", "g.txt:2: a second S- line for sentence id 0")
    fails(block.format(0) + "S-1\ta\nT-1\tw\nH-1\t-0.1\tw\n",
          "g.txt: sentence id 1 has an H- line but no D- line")
    fails("S-0\ta\nT-0\tw\nH-0\tw\n", "g.txt:3: expected 'H-<id>")
    (tmp_path / "quiet.txt").write_text("S-0\ta\nT-0\tw\nGenerate test: BLEU4 = 1.0\n")
    with pytest.raises(NoHypothesesError, match="quiet.txt: no hypotheses"):
        read_generate_output(str(tmp_path / "quiet.txt"))


def test_bpe_markers_and_removal():
    from ctx_fairseq.generate_output import lines_with_bpe, remove_bpe

    lines = ["the c@@ at", "a dog", "end@@", "\u2581the \u2581cat", "mail me @@home"]
    assert lines_with_bpe(lines) == {"subword_nmt": [0, 2], "sentencepiece": [3]}
    assert remove_bpe(lines[:3], "subword_nmt") == ["the cat", "a dog", "end"]
    assert remove_bpe(["\u2581the \u2581c at", "plain text"], "sentencepiece") == \
        ["the cat", "plain text"]  # lines without markers are left alone
    assert lines_with_bpe(remove_bpe(lines[:3], "subword_nmt")) == {}
    with pytest.raises(ValueError, match="--remove-bpe bpe: expected one of"):
        remove_bpe(lines, "bpe")


def test_bleu_metric_signature():
    from ctx_fairseq.generate_output import bleu_metric

    hyp, ref = ["the cat sat on the mat today"], ["the cat sat on a mat today"]
    m = bleu_metric()
    assert m.corpus_score(hyp, [ref]).score == pytest.approx(corpus_bleu(hyp, ref))
    assert "tok:13a" in str(m.get_signature())
    char = bleu_metric("char")
    char.corpus_score(hyp, [ref])
    assert "tok:char" in str(char.get_signature())
    with pytest.raises(ValueError, match="--tokenize 13b: not a sacreBLEU tokenizer"):
        bleu_metric("13b")
