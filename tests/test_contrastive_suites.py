"""Readers of the contrastive suite formats: what each returns, and a clear
error (file and line) for each kind of malformed input."""

import json
import os

import pytest

from ctx_fairseq.eval.scoring.contrastive_suites import SuiteError, read_suite
from suite_fixtures import write_contrapro, write_pairs, write_voita

EXAMPLES = [
    {"src": "it sleeps .", "ref": "er schlaeft .", "contrastive": ["sie schlaeft .", "es schlaeft ."],
     "ctx_src": ["the dog came ."], "ctx_tgt": ["der hund kam ."], "distance": 1,
     "category": "pronoun", "id": 1, "pos": 1},
    {"src": "we saw it .", "ref": "wir sahen sie .", "contrastive": ["wir sahen ihn ."],
     "ctx_src": [], "ctx_tgt": [], "distance": 5, "category": "pronoun", "id": 7, "pos": 0},
]


def test_toy(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"id": 3, "doc_id": "d", "phenomenon": "pronoun", "distance": 2,
                             "src": "a .", "ref": "b .", "contrastive": ["c ."]}) + "\n\n")
    s = read_suite("toy", str(p))
    assert s.context_sentences is None and len(s.examples) == 1
    ex = s.examples[0]
    assert (ex.corpus_line, ex.doc_id, ex.distance, ex.category) == (3, "d", "2", "pronoun")
    assert [c.target for c in ex.candidates] == ["b .", "c ."] and ex.correct == 0
    p.write_text(json.dumps({"id": 3, "phenomenon": "pronoun", "distance": None, "src": "a .",
                             "ref": "b .", "contrastive": ["c ."]}) + "\n")
    assert read_suite("toy", str(p)).examples[0].distance is None  # unknown distance


@pytest.mark.parametrize("content,match", [
    ("", "empty file"),
    ("{not json\n", r"t.jsonl:1: not valid JSON"),
    ('{"id": 1}\n', r"t.jsonl:1: missing field"),
    ('{"id": 1, "phenomenon": "p", "distance": 1, "src": "a", "ref": "b", "contrastive": []}\n',
     r"t.jsonl:1: 'contrastive' must list"),
    ('{"id": "x", "phenomenon": "p", "distance": 1, "src": "a", "ref": "b", "contrastive": ["c"]}\n',
     r"t.jsonl:1: 'id' must be a line number"),
    ('{"id": 1, "phenomenon": "p", "distance": 1, "src": "a", "ref": "b", "contrastive": ["c"]}\n'
     '{"id": 1, "phenomenon": "p", "distance": 1, "src": "a", "ref": "b", "contrastive": ["c"]}\n',
     r"t.jsonl:2: id 1 already used at .*t.jsonl:1"),
])
def test_toy_errors(tmp_path, content, match):
    p = tmp_path / "t.jsonl"
    p.write_text(content)
    with pytest.raises(SuiteError, match=match):
        read_suite("toy", str(p))


def test_voita_array_and_jsonl(tmp_path):
    p = write_voita(str(tmp_path / "deixis_test.json"), EXAMPLES, true_last=True)
    s = read_suite("voita", p)
    assert s.name == "deixis_test" and s.context_sentences == 1
    ex = s.examples[0]
    assert ex.source == "it sleeps ." and ex.src_context == ["the dog came ."]
    assert ex.correct == 2 and ex.candidates[2].target == "er schlaeft ."
    assert ex.candidates[0].tgt_context == ["der hund kam ."]
    assert ex.category == "deixis_test" and ex.distance == "1"
    assert s.examples[1].src_context == [] and s.examples[1].correct == 1
    # JSON Lines, no ctx_dist
    rows = json.load(open(p))
    jl = tmp_path / "ellipsis_vp.jsonl"
    jl.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "ctx_dist"}) + "\n"
                          for r in rows))
    s2 = read_suite("voita", str(jl))
    assert [e.distance for e in s2.examples] == [None, None]
    assert [c.target for c in s2.examples[0].candidates] == \
        [c.target for c in s.examples[0].candidates]


@pytest.mark.parametrize("entry,match", [
    ({"dst": ["a", "b"], "true_ind": 0}, r"entry 1: missing field 'src'"),
    ({"src": "x", "dst": ["a"], "true_ind": 0}, "at least two"),
    ({"src": "x", "dst": ["a", "b"], "true_ind": 2}, r"'true_ind' 2 is not an index"),
    ({"src": "c _eos x", "dst": ["a", "b _eos c"], "true_ind": 0},
     r"entry 1: candidate 0 has 1 sentences .* 'src' has 2"),
    ({"src": "_eos x", "dst": ["a _eos b", "b _eos c"], "true_ind": 0}, "empty sentence"),
])
def test_voita_errors(tmp_path, entry, match):
    p = tmp_path / "v.json"
    p.write_text(json.dumps([entry]))
    with pytest.raises(SuiteError, match=match):
        read_suite("voita", str(p))
    with pytest.raises(SuiteError, match=r"v.json:1: not valid JSON"):
        p.write_text("[{]")
        read_suite("voita", str(p))
    p.write_text("  \n")
    with pytest.raises(SuiteError, match="empty file"):
        read_suite("voita", str(p))


def test_contrapro(tmp_path):
    path = write_contrapro(str(tmp_path / "contrapro"), EXAMPLES, n_ctx=2)
    s = read_suite("contrapro", path)
    assert s.context_sentences == 2 and len(s.examples) == 2
    ex = s.examples[0]
    assert [c.target for c in ex.candidates] == ["er schlaeft .", "sie schlaeft .", "es schlaeft ."]
    # the script's "null" line (before the document's first line) is not context
    assert ex.context(1) == (["the dog came ."], ["der hund kam ."])
    assert "null" in open(tmp_path / "contrapro.context.en").read()
    assert s.examples[1].context(0) == ([], [])
    assert ex.category == "it:er" and ex.distance == "1" and s.examples[1].distance == ">3"
    # other suffixes
    p2 = write_contrapro(str(tmp_path / "cp2"), EXAMPLES, n_ctx=1, langs=("en", "fr"))
    with pytest.raises(SuiteError, match=r"cp2.text.de: no such file.*json2text_and_context"):
        read_suite("contrapro", p2)
    assert len(read_suite("contrapro", p2, langs=("en", "fr")).examples) == 2


def test_contrapro_errors(tmp_path):
    path = write_contrapro(str(tmp_path / "contrapro"), EXAMPLES, n_ctx=1)
    lines = open(tmp_path / "contrapro.text.de").read().splitlines()
    (tmp_path / "contrapro.text.de").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(SuiteError, match=r"contrapro.text.de: 4 lines, but .* has 5 candidates"):
        read_suite("contrapro", path)
    (tmp_path / "contrapro.text.de").write_text("\n".join(lines) + "\n")
    ctx = open(tmp_path / "contrapro.context.en").read().splitlines()
    (tmp_path / "contrapro.context.en").write_text("\n".join(ctx + ["x"]) + "\n")
    with pytest.raises(SuiteError, match="contrapro.context.de: 5 lines, but .*context.en has 6"):
        read_suite("contrapro", path)
    (tmp_path / "contrapro.context.de").write_text("\n".join(ctx + ["x"]) + "\n")
    with pytest.raises(SuiteError, match="whole number of context lines per text line"):
        read_suite("contrapro", path)
    (tmp_path / "contrapro.context.en").write_text("\n".join(ctx) + "\n")
    (tmp_path / "contrapro.context.de").write_text("\n".join(ctx) + "\n")
    src = open(tmp_path / "contrapro.text.en").read().splitlines()
    (tmp_path / "contrapro.text.en").write_text("\n".join(["other ."] + src[1:]) + "\n")
    with pytest.raises(SuiteError, match=r"contrapro.text.en:1-3: the lines of .*entry 1"):
        read_suite("contrapro", path)
    (tmp_path / "contrapro.text.en").write_text("\n".join(src) + "\n")
    entries = json.load(open(path))
    del entries[1]["ante distance"]
    (tmp_path / "contrapro.json").write_text(json.dumps(entries))
    with pytest.raises(SuiteError, match=r"contrapro.json: entry 2: missing field 'ante distance'"):
        read_suite("contrapro", path)


def test_bawden_and_lopes(tmp_path):
    prefix = write_pairs(str(tmp_path / "anaphora"), EXAMPLES, "bawden")
    s = read_suite("bawden", prefix)
    assert s.context_sentences == 1 and s.name == "anaphora"
    assert [[c.target for c in e.candidates] for e in s.examples] == \
        [["er schlaeft .", "sie schlaeft ."], ["wir sahen sie .", "wir sahen ihn ."]]
    assert s.examples[0].context(0) == (["the dog came ."], ["der hund kam ."])
    assert s.examples[1].context(1) == ([], [])
    assert s.examples[0].distance is None
    lp = write_pairs(str(tmp_path / "OpenSubs"), EXAMPLES, "lopes", n_ctx=3)
    with pytest.raises(SuiteError, match=r"OpenSubs.context.src: no such file; give "
                                         r"--suite-context N .*found: OpenSubs.c3.context.src"):
        read_suite("lopes", lp)
    s = read_suite("lopes", lp, context=3)
    assert s.context_sentences == 3
    assert s.examples[0].context(0) == (["the dog came ."], ["der hund kam ."])
    with pytest.raises(SuiteError, match="expected 2 per line"):
        os.rename(f"{lp}.c3.context.src", f"{lp}.c2.context.src")
        os.rename(f"{lp}.c3.context.trg", f"{lp}.c2.context.trg")
        read_suite("lopes", lp, context=2)
    # metadata matched by content, whatever the JSON's order
    meta = tmp_path / "meta.json"
    entries = [
        {"document id": "b", "src segment": "we  saw it .", "ref segment": "wir sahen sie .",
         "errors": [{"contrastive": "wir sahen ihn ."}], "src pronoun": "it",
         "ref pronoun": "sie", "ante distance": -1},
        {"document id": "a", "src segment": "it sleeps .", "ref segment": "er schlaeft .",
         "errors": [{"contrastive": "sie schlaeft ."}], "src pronoun": "it",
         "ref pronoun": "er", "ante distance": 5}]
    meta.write_text(json.dumps(entries))
    lp1 = write_pairs(str(tmp_path / "L"), EXAMPLES, "lopes", n_ctx=1)
    s = read_suite("lopes", lp1, context=1, meta=str(meta))
    assert [(e.category, e.distance) for e in s.examples] == [("it:er", ">3"), ("it:sie", None)]
    meta.write_text(json.dumps(entries[:1]))
    with pytest.raises(SuiteError, match=r"L.current.src:1: no entry of .*meta.json has this"):
        read_suite("lopes", lp1, context=1, meta=str(meta))
    meta.write_text(json.dumps([{"document id": "b"}]))
    with pytest.raises(SuiteError, match=r"meta.json: entry 1: expected 'src segment'"):
        read_suite("lopes", lp1, context=1, meta=str(meta))


def test_pair_errors(tmp_path):
    prefix = write_pairs(str(tmp_path / "anaphora"), EXAMPLES, "bawden")
    lines = open(prefix + ".current.en").read().splitlines()
    (tmp_path / "anaphora.current.en").write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(SuiteError, match=r"anaphora.prev.en: 4 lines, but .*current.en has 3"):
        read_suite("bawden", prefix)
    (tmp_path / "anaphora.current.en").write_text("\n".join(["x ."] + lines[1:]) + "\n")
    with pytest.raises(SuiteError, match=r"anaphora.current.en:1-2: a pair should have the same"):
        read_suite("bawden", prefix)
    for name in ("current.en", "current.fr", "prev.en", "prev.fr"):
        (tmp_path / f"anaphora.{name}").write_text("")
    with pytest.raises(SuiteError, match="empty file"):
        read_suite("bawden", prefix)
    with pytest.raises(SuiteError, match="no such file"):
        read_suite("bawden", str(tmp_path / "missing"))
    for name in ("current.en", "current.fr", "prev.en", "prev.fr"):
        (tmp_path / f"anaphora.{name}").write_text("a\nb\nc\n")
    with pytest.raises(SuiteError, match="3 lines; expected pairs"):
        read_suite("bawden", prefix)


def test_unknown_format():
    with pytest.raises(SuiteError, match="--format nope"):
        read_suite("nope", "x")
