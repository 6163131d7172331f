"""Reading fairseq-generate output."""

import pytest

from ctx_fairseq.eval.generate_output import corpus_bleu, read_generate_output

LOG = """S-1\tb c
T-1\tx y
H-1\t-0.2\tx y
H-1\t-0.9\tx z
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
