"""ctx-prep-docs: XML / blank-lines / docids input, validation errors, nothing
written on error, and the output going through fairseq-preprocess."""

import os
import re
import shutil

import pytest

from ctx_fairseq.prep import docs as pd
from ctx_fairseq.prep.xml_docs import read_xml_documents
from ctx_fairseq.data.docids import read_docid_lines
from fairseq_cli_utils import preprocess

from prep_docs_utils import (
    IWSLT_SETS, SRC_DOCS, TGT_DOCS, assert_error, fail_nth_fdopen, iwslt, needs_iwslt,
    out_files, raw_xml_counts, read_lines, read_text, run_cli, run_ok, seg_in_iwslt, write,
    xml_args, xml_file)


# ---------------------------------------------------------------------------
# IWSLT17 (shared data)


@needs_iwslt
@pytest.mark.parametrize("name", IWSLT_SETS)
def test_iwslt17_counts_and_text(name, tmp_path, capsys):
    prefix = str(tmp_path / name)
    out = run_ok(["xml", "--src-xml", iwslt(name, "en"), "--tgt-xml", iwslt(name, "de"),
                  "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", prefix], capsys)
    en, de, ids = (read_lines(f"{prefix}.{x}") for x in ("en", "de", "docids"))
    raw_en, docs_en, segs_en = raw_xml_counts(iwslt(name, "en"))
    raw_de, docs_de, segs_de = raw_xml_counts(iwslt(name, "de"))
    n_docs, n_segs = raw_en.count("<doc "), len(re.findall(r"<seg\b", raw_en))
    assert n_docs == len(docs_en) and n_segs == len(segs_en)
    assert len(en) == len(de) == len(ids) == n_segs == len(re.findall(r"<seg\b", raw_de))
    assert len(set(ids)) == n_docs == raw_de.count("<doc ")
    assert f"{n_docs} documents, {n_segs} sentences" in out
    # document order and contiguity as in the file
    assert [d for i, d in enumerate(ids) if i == 0 or ids[i - 1] != d] == docs_en == docs_de
    assert ids == [d for d, _, _ in segs_en]
    # every line is the segment's unescaped, stripped text
    assert en == [t for _, _, t in segs_en]
    assert de == [t for _, _, t in segs_de]
    for line in en + de:
        assert line == line.strip() and line
        assert not re.search(r"&(amp|lt|gt|quot|apos|#\d+);", line)


@needs_iwslt
def test_iwslt17_entities_unescaped(tmp_path):
    raw = read_text(iwslt("tst2010", "en"))
    m = re.search(r'<seg id="(\d+)">([^<]*&amp;[^<]*)</seg>', raw)
    assert m, "tst2010.en has segments with &amp;"
    prefix = str(tmp_path / "t")
    summary = pd.prepare_documents("xml", iwslt("tst2010", "en"), iwslt("tst2010", "de"),
                                   "en", "de", prefix)
    en = read_lines(prefix + ".en")
    expected = m.group(2).replace("&amp;", "&").strip()
    assert expected in en and "R&D" in expected
    assert summary.documents == 11 and summary.sentences == len(en) == 1568


@needs_iwslt
def test_iwslt17_corrupted_seg_id_rejected(tmp_path, capsys):
    raw = read_text(iwslt("tst2010", "de"))
    pos, docid, line = seg_in_iwslt(raw, 5)
    bad = write(tmp_path / "bad.de.xml", raw[:pos] + '<seg id="6">' + raw[pos + len('<seg id="5">'):])
    out_dir = tmp_path / "out"
    err = assert_error(["xml", "--src-xml", iwslt("tst2010", "en"), "--tgt-xml", bad,
                        "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", str(out_dir / "t")],
                       capsys, out_dir, bad, line, f"document {docid}, segment 6",
                       "expected segment id 5", f"{iwslt('tst2010', 'en')}:{line}")
    assert "duplicate" not in err


@needs_iwslt
def test_iwslt17_renumbered_seg_id_rejected(tmp_path, capsys):
    """A segment id changed to one not used in its document: a pure alignment error."""
    raw = read_text(iwslt("dev2010", "de"))
    _, docid, line = seg_in_iwslt(raw, 5)
    bad = write(tmp_path / "bad.de.xml", raw.replace('<seg id="5">', '<seg id="5000">', 1))
    out_dir = tmp_path / "out"
    assert_error(["xml", "--src-xml", iwslt("dev2010", "en"), "--tgt-xml", bad,
                  "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", str(out_dir / "t")],
                 capsys, out_dir, bad, line, f"document {docid}, segment 5000",
                 "expected segment id 5", iwslt("dev2010", "en"))


# ---------------------------------------------------------------------------
# small XML


def test_read_xml_documents(tmp_path):
    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    assert read_xml_documents(src) == [
        ("d1", [("1", "Hello  world."), ("2", 'R&D <b> "q" été')]),
        ("d2", [("1", "One."), ("2", "Two."), ("3", "Three.")]),
    ]


def test_read_xml_documents_duplicate_segid(tmp_path):
    bad = write(tmp_path / "b.xml", '<r>\n<doc docid="a">\n<seg id="1">x</seg>\n<seg id="1">y</seg>\n</doc></r>')
    with pytest.raises(pd.PrepDocsError) as e:
        read_xml_documents(bad)
    assert (e.value.path, e.value.line) == (bad, 4)
    assert "document a, segment 1: duplicate segment id (first at line 3)" in str(e.value)


def test_xml_small(tmp_path, capsys):
    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    tgt = xml_file(tmp_path / "t.xml", TGT_DOCS)
    prefix = str(tmp_path / "out" / "train")
    out = run_ok(xml_args(src, tgt, prefix), capsys)
    assert out.strip() == f"ctx-prep-docs: 2 documents, 5 sentences -> {prefix}.{{en,de,docids}}"
    assert read_lines(prefix + ".en") == ["Hello  world.", 'R&D <b> "q" été', "One.", "Two.", "Three."]
    assert read_lines(prefix + ".de") == ["Hallo Welt.", "F&E", "Eins.", "Zwei.", "Drei."]
    assert read_lines(prefix + ".docids") == ["d1", "d1", "d2", "d2", "d2"]
    assert out_files(tmp_path / "out") == ["train.de", "train.docids", "train.en"]


def test_xml_segment_over_several_lines(tmp_path):
    src = write(tmp_path / "s.xml", '<r><doc docid="a"><seg id="1">\n  first\n  part\r\n</seg>'
                                    '<seg id="2">x\u2028y</seg></doc></r>')
    tgt = write(tmp_path / "t.xml", '<r><doc docid="a"><seg id="1">erst</seg><seg id="2">z</seg></doc></r>')
    summary = pd.prepare_documents("xml", src, tgt, "en", "de", str(tmp_path / "p"))
    assert read_lines(str(tmp_path / "p.en")) == ["first part", "x y"]
    assert summary.line_breaks_replaced == 2 and summary.sentences == 2


# (description, src docs, tgt docs, file at fault, line, fragments)
XML_ERRORS = [
    ("renumbered segment", SRC_DOCS, [TGT_DOCS[0], ("d2", [("1", "a"), ("4", "b"), ("3", "c")])],
     "t", 12, ["document d2, segment 4", "expected segment id 2", "s.xml:12"]),
    ("missing segment", SRC_DOCS, [TGT_DOCS[0], ("d2", [("1", "a"), ("2", "b")])],
     "t", 13, ["document d2: segment 3", "is missing", "2 segments, expected 3"]),
    ("extra segment in target", SRC_DOCS, [TGT_DOCS[0], ("d2", TGT_DOCS[1][1] + [("4", "x")])],
     "s", 14, ["document d2: segment 4", "t.xml:14", "3 segments, expected 4"]),
    ("documents swapped", SRC_DOCS, [TGT_DOCS[1], TGT_DOCS[0]],
     "t", 4, ["document d2 is document #1", "expected document d1"]),
    ("missing document", SRC_DOCS, TGT_DOCS[:1],
     "t", 10, ["document d2", "is missing", "ends after 1 documents, expected 2"]),
    ("duplicate docid", SRC_DOCS, [TGT_DOCS[0], ("d1", TGT_DOCS[1][1])],
     "t", 9, ["duplicate document id d1", "first at line 4"]),
    ("duplicate seg id", [SRC_DOCS[0], ("d2", [("1", "a"), ("1", "b"), ("3", "c")])],
     [TGT_DOCS[0], ("d2", [("1", "a"), ("1", "b"), ("3", "c")])],
     "s", 12, ["document d2, segment 1", "duplicate segment id", "first at line 11"]),
    ("seg id repeated on one side", SRC_DOCS, [TGT_DOCS[0], ("d2", [("1", "a"), ("1", "b"), ("3", "c")])],
     "t", 12, ["document d2, segment 1", "expected segment id 2", "s.xml:12"]),
    ("empty document", SRC_DOCS, [TGT_DOCS[0], ("d2", [])],
     "t", 9, ["document d2 has no segments"]),
    ("empty segment", SRC_DOCS, [TGT_DOCS[0], ("d2", [("1", "a"), ("2", "   "), ("3", "c")])],
     "t", 12, ["document d2, segment 2", "empty segment", "--allow-empty"]),
    ("malformed", SRC_DOCS, [TGT_DOCS[0], ("d2", [("1", "a"), ("2", "b < c"), ("3", "c")])],
     "t", 12, ["malformed XML", "not well-formed"]),
    ("undefined entity", [SRC_DOCS[0], ("d2", [("1", "&nbsp;x"), ("2", "y"), ("3", "z")])], TGT_DOCS,
     "s", 11, ["malformed XML", "undefined entity"]),
]


@pytest.mark.parametrize("case", XML_ERRORS, ids=[c[0] for c in XML_ERRORS])
def test_xml_errors(case, tmp_path, capsys):
    _, src_docs, tgt_docs, where, line, fragments = case
    src = xml_file(tmp_path / "s.xml", src_docs)
    tgt = xml_file(tmp_path / "t.xml", tgt_docs)
    out_dir = tmp_path / "out"
    path = src if where == "s" else tgt
    assert_error(xml_args(src, tgt, str(out_dir / "train")), capsys, out_dir, path, line, *fragments)


def test_xml_structure_errors(tmp_path, capsys):
    good = write(tmp_path / "g.xml", '<r><doc docid="a"><seg id="1">x</seg></doc></r>')
    out_dir = tmp_path / "out"
    cases = [
        ('<r>\n<doc genre="x">\n<seg id="1">x</seg></doc></r>', 2, "without a docid"),
        ('<r>\n<doc docid="a">\n<seg>x</seg></doc></r>', 3, "without an id"),
        ('<r>\n<seg id="1">x</seg>\n</r>', 2, "outside any <doc>"),
        ('<r>\n<doc docid="a">\n<doc docid="b"><seg id="1">x</seg></doc></doc></r>', 3, "inside document a"),
        ('<r>\n<doc docid="a b">\n<seg id="1">x</seg></doc></r>', 2, "contains whitespace"),
        ('<r>\n<p>nothing</p>\n</r>', 1, "no <doc> elements"),
        ('<r>\n<doc docid="a">\n<seg id="1">x</seg></doc>\n', 4, "malformed XML"),
        ("", 1, "malformed XML"),
    ]
    for text, line, frag in cases:
        bad = write(tmp_path / "bad.xml", text)
        assert_error(xml_args(good, bad, str(out_dir / "p")), capsys, out_dir, bad, line, frag)


def test_xml_allow_empty(tmp_path, capsys):
    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    tgt = xml_file(tmp_path / "t.xml", [TGT_DOCS[0], ("d2", [("1", "a"), ("2", " "), ("3", "c")])])
    prefix = str(tmp_path / "p")
    code, _, err = run_cli(xml_args(src, tgt, prefix, "--allow-empty"), capsys)
    assert code == 0, err
    assert read_lines(prefix + ".de") == ["Hallo Welt.", "F&E", "a", "", "c"]
    assert len(read_lines(prefix + ".en")) == len(read_lines(prefix + ".docids")) == 5


# ---------------------------------------------------------------------------
# blank-lines mode


def blank_args(src, tgt, prefix, *extra):
    return ["blank-lines", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de",
            "--out-prefix", prefix, *extra]


def test_blank_lines(tmp_path, capsys):
    src = write(tmp_path / "s.txt", "\na1\na2\n\nb1\n  \nc1\nc2\nc3\n\n")
    tgt = write(tmp_path / "t.txt", "\r\nA1\r\nA2\r\n\r\nB1\r\n\r\nC1\r\nC2\r\nC3\r\n\r\n")
    prefix = str(tmp_path / "out" / "x")
    code, out, err = run_cli(blank_args(src, tgt, prefix), capsys)
    assert code == 0, err
    assert "3 documents, 6 sentences" in out
    assert read_lines(prefix + ".en") == ["a1", "a2", "b1", "c1", "c2", "c3"]
    assert read_lines(prefix + ".de") == ["A1", "A2", "B1", "C1", "C2", "C3"]
    assert read_lines(prefix + ".docids") == ["doc00000", "doc00000", "doc00001",
                                              "doc00002", "doc00002", "doc00002"]
    code, _, err = run_cli(blank_args(src, tgt, prefix, "--doc-prefix", "ted."), capsys)
    assert code == 0, err
    assert read_lines(prefix + ".docids")[2] == "ted.00001"
    code, _, err = run_cli(blank_args(src, tgt, str(tmp_path / "o2" / "x"), "--doc-prefix", "a b"), capsys)
    assert code == 2 and "--doc-prefix: 'a b' contains whitespace" in err
    assert out_files(tmp_path / "o2") == []


def test_blank_lines_errors(tmp_path, capsys):
    out_dir = tmp_path / "out"
    prefix = str(out_dir / "x")
    src = write(tmp_path / "s.txt", "a1\na2\n\nb1\n")
    cases = [
        ("a1\n\nA2\nb1\n", "t", 2, ["blank line (document break)", "s.txt:2 has a sentence"]),
        ("a1\na2\nB\nb1\n", "t", 3, ["sentence where", "s.txt:3 is a blank line"]),
        ("a1\na2\n\n", "t", 3, ["file ends after 3 lines", "expected 4 lines", "s.txt"]),
        ("a1\na2\n\nb1\nb2\n", "s", 4, ["file ends after 4 lines", "expected 5 lines"]),
    ]
    for text, where, line, frags in cases:
        tgt = write(tmp_path / "t.txt", text)
        assert_error(blank_args(src, tgt, prefix), capsys, out_dir, src if where == "s" else tgt,
                     line, *frags)
    two = write(tmp_path / "two.txt", "a\n\n\nb\n")
    assert_error(blank_args(two, two.replace("two", "two"), prefix), capsys, out_dir, two, 3,
                 "second blank line in a row", "empty document")
    empty = write(tmp_path / "empty.txt", "\n \n")
    assert_error(blank_args(empty, empty, prefix), capsys, out_dir, empty, 1, "no sentences")


def test_line_separators_inside_lines(tmp_path):
    """U+2028 and friends are line breaks for str.splitlines(): replaced so that
    every reader of the output sees one line per sentence."""
    src = write(tmp_path / "s.txt", "a\u2028b\nc\x85d\n")
    tgt = write(tmp_path / "t.txt", "x\ny\n")
    summary = pd.prepare_documents("blank-lines", src, tgt, "en", "de", str(tmp_path / "p"))
    with open(tmp_path / "p.en", encoding="utf-8") as f:
        assert f.read().splitlines() == ["a b", "c d"]
    assert summary.line_breaks_replaced == 2


# ---------------------------------------------------------------------------
# docids mode


def docids_args(src, tgt, ids, prefix, *extra):
    return ["docids", "--src", src, "--tgt", tgt, "--docids", ids, "--src-lang", "en",
            "--tgt-lang", "de", "--out-prefix", prefix, *extra]


def test_docids_mode(tmp_path, capsys):
    src = write(tmp_path / "s.txt", "a1\na2\nb1\nc1\n")
    tgt = write(tmp_path / "t.txt", "A1\nA2\nB1\nC1\n")
    ids = write(tmp_path / "ids.txt", "talk7\ntalk7 \nx\ntalk2\n")
    prefix = str(tmp_path / "p")
    out = run_ok(docids_args(src, tgt, ids, prefix), capsys)
    assert "3 documents, 4 sentences" in out
    assert read_lines(prefix + ".docids") == ["talk7", "talk7", "x", "talk2"]
    assert read_lines(prefix + ".en") == ["a1", "a2", "b1", "c1"]
    assert read_lines(prefix + ".de") == ["A1", "A2", "B1", "C1"]


def test_read_docids(tmp_path):
    ok = write(tmp_path / "ok", "a\na\nb\nc\nc\n")
    assert read_docid_lines(ok) == ["a", "a", "b", "c", "c"]
    bad = write(tmp_path / "bad", "a\na\nb\na\n")
    with pytest.raises(pd.PrepDocsError) as e:
        read_docid_lines(bad)
    assert (e.value.path, e.value.line) == (bad, 4)
    assert "document a reappears" in str(e.value) and "lines 1-2" in str(e.value)
    assert str(e.value).startswith(f"{bad}:4: ")


def test_docids_errors(tmp_path, capsys):
    out_dir = tmp_path / "out"
    prefix = str(out_dir / "p")
    src = write(tmp_path / "s.txt", "a1\na2\nb1\n")
    tgt = write(tmp_path / "t.txt", "A1\nA2\nB1\n")
    ids = write(tmp_path / "ids.txt", "a\na\nb\n")
    cases = [  # (file to replace, its text, file at fault, line, fragments)
        ("ids", "a\nb\na\n", "ids", 3, ["document a reappears", "contiguous"]),
        ("ids", "a\na\n", "ids", 2, ["file ends after 2 lines", "expected 3 lines"]),
        ("ids", "a\n\nb\n", "ids", 2, ["empty document id"]),
        ("ids", "", "ids", 1, ["empty file"]),
        ("tgt", "A1\nA2\n", "tgt", 2, ["file ends after 2 lines", "expected 3 lines", "ids.txt"]),
        ("src", "a1\na2\nb1\nextra\n", "ids", 3, ["expected 4 lines", "s.txt"]),
        ("tgt", "A1\n \nB1\n", "tgt", 2, ["empty line in document a", "--allow-empty"]),
        ("src", "a1\na2\n\n", "src", 3, ["empty line in document b"]),
    ]
    originals = {"src": read_text(src), "tgt": read_text(tgt), "ids": read_text(ids)}
    paths = {"src": src, "tgt": tgt, "ids": ids}
    for which, text, where, line, frags in cases:
        write(paths[which], text)
        assert_error(docids_args(src, tgt, ids, prefix), capsys, out_dir, paths[where], line, *frags)
        write(paths[which], originals[which])
    code, _, err = run_cli(docids_args(src, tgt, ids, prefix), capsys)
    assert code == 0, err


def test_docids_allow_empty(tmp_path, capsys):
    src = write(tmp_path / "s.txt", "a1\n\nb1\n")
    tgt = write(tmp_path / "t.txt", "A1\nA2\nB1\n")
    ids = write(tmp_path / "ids.txt", "a\na\nb\n")
    prefix = str(tmp_path / "p")
    code, _, err = run_cli(docids_args(src, tgt, ids, prefix, "--allow-empty"), capsys)
    assert code == 0, err
    assert read_lines(prefix + ".en") == ["a1", "", "b1"]
    assert read_lines(prefix + ".docids") == ["a", "a", "b"]


# ---------------------------------------------------------------------------
# output handling


def test_error_leaves_existing_outputs_alone(tmp_path, capsys):
    src = write(tmp_path / "s.txt", "a\n")
    tgt = write(tmp_path / "t.txt", "A\n")
    prefix = str(tmp_path / "out" / "p")
    assert run_cli(blank_args(src, tgt, prefix), capsys)[0] == 0
    before = {f: read_text(tmp_path / "out" / f) for f in out_files(tmp_path / "out")}
    bad = write(tmp_path / "bad.txt", "A\nB\n")
    code, _, err = run_cli(blank_args(src, bad, prefix), capsys)
    assert code == 2 and "expected 2 lines" in err
    assert {f: read_text(tmp_path / "out" / f) for f in out_files(tmp_path / "out")} == before


def test_write_failure_leaves_nothing(tmp_path, monkeypatch):
    docs = [("d", [("a", "b")])]
    out_dir = tmp_path / "out"
    fail_nth_fdopen(monkeypatch, 3)
    with pytest.raises(OSError):
        pd.write_documents(docs, str(out_dir / "p"), "en", "de")
    assert out_files(out_dir) == []


def test_bad_output_arguments(tmp_path, capsys):
    src = write(tmp_path / "s.txt", "a\n")
    tgt = write(tmp_path / "t.txt", "A\n")
    base = ["blank-lines", "--src", src, "--tgt", tgt]
    code, _, err = run_cli(base + ["--src-lang", "en", "--tgt-lang", "en", "--out-prefix",
                                   str(tmp_path / "p")], capsys)
    assert code == 2 and "--tgt-lang: same as --src-lang" in err
    code, _, err = run_cli(base + ["--src-lang", "txt", "--tgt-lang", "de", "--out-prefix",
                                   str(tmp_path / "s")], capsys)
    assert code == 2 and "overwrite an input file" in err
    assert read_text(src) == "a\n"
    code, _, err = run_cli(base + ["--src-lang", "en", "--tgt-lang", "docids", "--out-prefix",
                                   str(tmp_path / "p")], capsys)
    assert code == 2 and "collide" in err
    assert sorted(os.listdir(tmp_path)) == ["s.txt", "t.txt"]


# ---------------------------------------------------------------------------
# fairseq-preprocess


def test_output_through_fairseq_preprocess(tmp_path):
    from fairseq.data import data_utils
    from fairseq.data.dictionary import Dictionary

    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    tgt = xml_file(tmp_path / "t.xml", TGT_DOCS)
    prefix = str(tmp_path / "raw" / "train")
    pd.prepare_documents("xml", src, tgt, "en", "de", prefix)
    dest = str(tmp_path / "bin")
    preprocess(["--source-lang", "en", "--target-lang", "de", "--trainpref", prefix,
                "--destdir", dest, "--workers", "1", "--joined-dictionary"])
    shutil.copy(prefix + ".docids", os.path.join(dest, "train.docids"))
    d = Dictionary.load(os.path.join(dest, "dict.en.txt"))
    for lang in ("en", "de"):
        ds = data_utils.load_indexed_dataset(os.path.join(dest, f"train.en-de.{lang}"), d)
        lines = read_lines(f"{prefix}.{lang}")
        assert len(ds) == len(lines) == len(read_lines(os.path.join(dest, "train.docids"))) == 5
        for i, line in enumerate(lines):
            assert d.string(ds[i]) == " ".join(line.split())
