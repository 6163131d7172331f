"""The synthetic discourse corpus: determinism, files, bad input, and the
property that matters (context determines what the sentence alone cannot)."""

import collections
import json
import os
import stat

import pytest

from ctx_fairseq.cli import make_toy
from ctx_fairseq.data import toy_corpus as tc


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toy_big"))
    tc.make_toy_corpus(out, docs=400, sents_per_doc=12, max_distance=4, seed=7,
                       valid_docs=20, test_docs=300)
    return out


def test_files_and_counts(big_corpus):
    meta = json.load(open(os.path.join(big_corpus, "toy.json")))
    for split in tc.SPLITS:
        src = read_lines(os.path.join(big_corpus, f"{split}.src"))
        tgt = read_lines(os.path.join(big_corpus, f"{split}.tgt"))
        ids = read_lines(os.path.join(big_corpus, f"{split}.docids"))
        assert len(src) == len(tgt) == len(ids) == meta["lines"][split]
        assert len(src) == meta["docs"][split] * 12
        # documents are contiguous: an id never comes back after another started
        seen, prev = set(), None
        for doc_id in ids:
            if doc_id != prev:
                assert doc_id not in seen
                seen.add(doc_id)
                prev = doc_id
    assert not [n for n in os.listdir(big_corpus) if n.startswith(".")]


def test_deterministic_for_a_seed(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    tc.make_toy_corpus(a, docs=20, seed=3)
    tc.make_toy_corpus(b, docs=20, seed=3)
    tc.make_toy_corpus(c, docs=20, seed=4)
    for name in ("train.src", "train.tgt", "test.contrastive.jsonl"):
        assert read_lines(os.path.join(a, name)) == read_lines(os.path.join(b, name))
    assert read_lines(os.path.join(a, "train.tgt")) != read_lines(os.path.join(c, "train.tgt"))


def _pronoun_items(corpus, split):
    """(line, src sentence, target pronoun) for every pronoun sentence of a split."""
    src = read_lines(os.path.join(corpus, f"{split}.src"))
    tgt = read_lines(os.path.join(corpus, f"{split}.tgt"))
    ids = read_lines(os.path.join(corpus, f"{split}.docids"))
    items = [(i, src[i], tgt[i].split()[0]) for i in range(len(src)) if src[i].split()[0] == "it"]
    return src, ids, items


def _context_rule(src, ids, line, k):
    """Gender of the most recent entity noun in the previous k sentences of the document."""
    for back in range(1, k + 1):
        j = line - back
        if j < 0 or ids[j] != ids[line]:
            return None, None
        for tok in reversed(src[j].split()):
            if tok in tc.ENTITY_NOUNS:
                return tc.PRONOUN[tc.ENTITY_NOUNS[tok][1]], back
    return None, None


def test_pronoun_needs_the_previous_k_sentences(big_corpus):
    k = 4
    train_src, _, train_items = _pronoun_items(big_corpus, "train")
    test_src, test_ids, test_items = _pronoun_items(big_corpus, "test")
    assert len(test_items) > 300

    # Without context: the best predictor from the sentence alone (majority
    # pronoun per source sentence, learned on train) is at chance (1/3).
    by_sentence = collections.defaultdict(collections.Counter)
    for _, s, p in train_items:
        by_sentence[s][p] += 1
    overall = collections.Counter(p for _, _, p in train_items).most_common(1)[0][0]
    correct = sum(
        (by_sentence[s].most_common(1)[0][0] if s in by_sentence else overall) == p
        for _, s, p in test_items
    )
    sentence_only = correct / len(test_items)
    assert abs(sentence_only - 1 / 3) < 0.08, sentence_only
    # ... and the three pronouns are (near) uniform.
    freq = collections.Counter(p for _, _, p in test_items)
    assert set(freq) == {"er", "sie", "es"}
    assert min(freq.values()) / len(test_items) > 0.25

    # With the previous K sentences: determined (100%), at every distance 1..K.
    distances = collections.Counter()
    for line, _, pron in test_items:
        predicted, distance = _context_rule(test_src, test_ids, line, k)
        assert predicted == pron
        distances[distance] += 1
    assert set(distances) == set(range(1, k + 1))

    # With fewer sentences than the antecedent distance, nothing is found.
    misses = sum(_context_rule(test_src, test_ids, line, 1)[0] is None for line, _, _ in test_items)
    assert misses > 0


def test_contrastive_set(big_corpus):
    recs = tc.read_contrastive(os.path.join(big_corpus, "test.contrastive.jsonl"))
    src = read_lines(os.path.join(big_corpus, "test.src"))
    tgt = read_lines(os.path.join(big_corpus, "test.tgt"))
    ids = read_lines(os.path.join(big_corpus, "test.docids"))
    phenomena = collections.Counter(r["phenomenon"] for r in recs)
    assert phenomena["pronoun"] > 100 and phenomena["lexical_cohesion"] > 50
    for r in recs:
        assert src[r["id"]] == r["src"] and tgt[r["id"]] == r["ref"]
        assert 1 <= r["distance"] <= 4
        assert ids[r["antecedent_id"]] == ids[r["id"]] == r["doc_id"]
        ref = r["ref"].split()
        for alt, word in zip(r["contrastive"], r["contrastive_words"]):
            alt = alt.split()
            diff = [i for i, (a, b) in enumerate(zip(ref, alt)) if a != b]
            assert len(alt) == len(ref) and diff == [r["word_index"]]
            assert alt[r["word_index"]] == word != r["word"]
        if r["phenomenon"] == "lexical_cohesion":
            # the antecedent mention names the sense; the translation repeats it
            assert r["word"] in tgt[r["antecedent_id"]].split()
            assert not set(r["contrastive_words"]) & set(tgt[r["antecedent_id"]].split())
    assert len(recs) == sum(1 for s in src if s.split()[0] == "it") + phenomena["lexical_cohesion"]


def test_local_reordering(big_corpus):
    src = read_lines(os.path.join(big_corpus, "train.src"))
    tgt = read_lines(os.path.join(big_corpus, "train.tgt"))
    checked = 0
    for s, t in zip(src, tgt):
        s, t = s.split(), t.split()
        for i in range(len(s) - 1):
            if s[i] in tc.ADJECTIVES and s[i + 1] in tc.ENTITY_NOUNS:
                noun, gender = tc.ENTITY_NOUNS[s[i + 1]]
                j = t.index(noun)
                assert t[j + 1] == tc.ADJECTIVES[s[i]]  # noun-adjective in the target
                assert t[j - 1] in (tc.DEFINITE[gender], tc.INDEFINITE[gender])
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("argv,message", [
    (["--docs", "0"], "--docs must be an integer >= 1"),
    (["--max-distance", "-2"], "--max-distance must be an integer >= 1"),
    (["--sents-per-doc", "3", "--max-distance", "3"], "--sents-per-doc must be"),
])
def test_bad_arguments_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        make_toy.cli_main(["--out", str(out), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only directories")
def test_unwritable_output_directory_non_root(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(SystemExit):
            make_toy.cli_main(["--out", str(ro / "sub"), "--docs", "2"])
        assert "cannot write there" in capsys.readouterr().err
        assert not (ro / "sub").exists()
    finally:
        ro.chmod(stat.S_IRWXU)


def test_unwritable_output_path(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit):
        make_toy.cli_main(["--out", str(blocker / "sub"), "--docs", "2"])
    assert "cannot write there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_toy.cli_main(["--out", str(blocker), "--docs", "2"])
    assert "not a directory" in capsys.readouterr().err
    assert blocker.read_text() == "x"


def test_failure_midway_leaves_nothing_partial(tmp_path, monkeypatch):
    out = tmp_path / "out"
    calls = {"n": 0}
    real = tc.contrastive_records

    def boom(docs):
        calls["n"] += 1
        raise RuntimeError("disk full")

    monkeypatch.setattr(tc, "contrastive_records", boom)
    with pytest.raises(RuntimeError):
        tc.make_toy_corpus(str(out), docs=3)
    assert calls["n"] == 1 and os.listdir(out) == []
    monkeypatch.setattr(tc, "contrastive_records", real)
