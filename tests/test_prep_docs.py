"""ctx-prep-docs: XML / blank-lines / docids input, validation errors, nothing
written on error, and the output going through fairseq-preprocess."""

import html
import os
import re
import shutil

import pytest

from ctx_fairseq.prep import docs as pd
from fairseq_cli_utils import REPO_ROOT, preprocess, run_main

IWSLT_DIR = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data", "iwslt17-ted-en-de"))
IWSLT_SETS = ["dev2010", "tst2010", "tst2011", "tst2012", "tst2013", "tst2014", "tst2015"]

needs_iwslt = pytest.mark.skipif(not os.path.isdir(IWSLT_DIR),
                                 reason=f"IWSLT17 data not found at {IWSLT_DIR}")


def iwslt(name, lang):
    return os.path.join(IWSLT_DIR, f"IWSLT17.TED.{name}.en-de.{lang}.xml")


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    assert text.endswith("\n") and "\r" not in text
    return text[:-1].split("\n")


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


def run_cli(argv, capsys):
    """Run ctx-prep-docs; returns (exit status, stdout, stderr)."""
    return run_main(pd.cli_main, argv, capsys)


def out_files(out_dir):
    return sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []


def assert_error(argv, capsys, out_dir, path, line, *fragments):
    """The command fails with status 2, names PATH:LINE and each fragment, and
    leaves nothing (not even a temporary file) in OUT_DIR."""
    code, out, err = run_cli(argv, capsys)
    assert code == 2, (out, err)
    assert err.startswith(f"ctx-prep-docs: error: {path}:{line}: "), err
    for frag in fragments:
        assert frag in err, (frag, err)
    assert out_files(out_dir) == []
    return err


def raw_xml_counts(path):
    """Document ids, and (docid, segid, text) for every segment, found with
    regular expressions over the raw file (independently of the XML parser)."""
    raw = read_text(path)
    docids = re.findall(r'<doc\s[^>]*docid="([^"]*)"', raw)
    chunks = re.split(r"<doc\s", raw)[1:]
    assert len(chunks) == len(docids)
    segs = []
    for docid, chunk in zip(docids, chunks):
        for segid, body in re.findall(r'<seg id="([^"]*)">(.*?)</seg>', chunk, re.S):
            segs.append((docid, segid, html.unescape(body).strip()))
    return raw, docids, segs


# ---------------------------------------------------------------------------
# IWSLT17 (shared data)


@needs_iwslt
@pytest.mark.parametrize("name", IWSLT_SETS)
def test_iwslt17_counts_and_text(name, tmp_path, capsys):
    prefix = str(tmp_path / name)
    code, out, err = run_cli(["xml", "--src-xml", iwslt(name, "en"), "--tgt-xml", iwslt(name, "de"),
                              "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", prefix], capsys)
    assert code == 0, err
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
    pos = raw.index('<seg id="5">')
    docid = re.findall(r'<doc\s[^>]*docid="([^"]*)"', raw[:pos])[-1]
    line = raw[:pos].count("\n") + 1
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
    pos = raw.index('<seg id="5">')
    docid = re.findall(r'<doc\s[^>]*docid="([^"]*)"', raw[:pos])[-1]
    line = raw[:pos].count("\n") + 1
    bad = write(tmp_path / "bad.de.xml", raw.replace('<seg id="5">', '<seg id="5000">', 1))
    out_dir = tmp_path / "out"
    assert_error(["xml", "--src-xml", iwslt("dev2010", "en"), "--tgt-xml", bad,
                  "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", str(out_dir / "t")],
                 capsys, out_dir, bad, line, f"document {docid}, segment 5000",
                 "expected segment id 5", iwslt("dev2010", "en"))


# ---------------------------------------------------------------------------
# small XML


def xml_file(path, docs, header='<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="t">\n'):
    """docs: list of (docid, [(segid, raw xml text)]); one element per line."""
    lines = [header.rstrip("\n")]
    for docid, segs in docs:
        lines.append(f'<doc docid="{docid}" genre="lectures">')
        lines.append(f"<title>Talk {docid} &amp; more</title>")
        lines += [f'<seg id="{sid}">{text}</seg>' for sid, text in segs]
        lines.append("</doc>")
    lines += ["</srcset>", "</mteval>"]
    return write(path, "\n".join(lines) + "\n")


SRC_DOCS = [("d1", [("1", " Hello  world.  "), ("2", "R&amp;D &lt;b&gt; &quot;q&quot; &#233;t&#xE9;")]),
            ("d2", [("1", "\tOne."), ("2", "Two."), ("3", "Three.")])]
TGT_DOCS = [("d1", [("1", "Hallo Welt."), ("2", "F&amp;E")]),
            ("d2", [("1", "Eins."), ("2", "Zwei."), ("3", "Drei. ")])]


def xml_args(src, tgt, prefix, *extra):
    return ["xml", "--src-xml", src, "--tgt-xml", tgt, "--src-lang", "en", "--tgt-lang", "de",
            "--out-prefix", prefix, *extra]


def test_read_xml_documents(tmp_path):
    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    assert pd.read_xml_documents(src) == [
        ("d1", [("1", "Hello  world."), ("2", 'R&D <b> "q" été')]),
        ("d2", [("1", "One."), ("2", "Two."), ("3", "Three.")]),
    ]


def test_read_xml_documents_duplicate_segid(tmp_path):
    bad = write(tmp_path / "b.xml", '<r>\n<doc docid="a">\n<seg id="1">x</seg>\n<seg id="1">y</seg>\n</doc></r>')
    with pytest.raises(pd.PrepDocsError) as e:
        pd.read_xml_documents(bad)
    assert (e.value.path, e.value.line) == (bad, 4)
    assert "document a, segment 1: duplicate segment id (first at line 3)" in str(e.value)


def test_xml_small(tmp_path, capsys):
    src = xml_file(tmp_path / "s.xml", SRC_DOCS)
    tgt = xml_file(tmp_path / "t.xml", TGT_DOCS)
    prefix = str(tmp_path / "out" / "train")
    code, out, err = run_cli(xml_args(src, tgt, prefix), capsys)
    assert code == 0, err
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
    code, out, err = run_cli(docids_args(src, tgt, ids, prefix), capsys)
    assert code == 0, err
    assert "3 documents, 4 sentences" in out
    assert read_lines(prefix + ".docids") == ["talk7", "talk7", "x", "talk2"]
    assert read_lines(prefix + ".en") == ["a1", "a2", "b1", "c1"]
    assert read_lines(prefix + ".de") == ["A1", "A2", "B1", "C1"]


def test_read_docids(tmp_path):
    ok = write(tmp_path / "ok", "a\na\nb\nc\nc\n")
    assert pd.read_docids(ok) == ["a", "a", "b", "c", "c"]
    bad = write(tmp_path / "bad", "a\na\nb\na\n")
    with pytest.raises(pd.PrepDocsError) as e:
        pd.read_docids(bad)
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
    real = os.fdopen
    calls = []

    def failing_fdopen(fd, *a, **k):
        calls.append(fd)
        if len(calls) == 3:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real(fd, *a, **k)

    monkeypatch.setattr(pd.os, "fdopen", failing_fdopen)
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


# ---------------------------------------------------------------------------
# WMT test-set XML (WMT21 and later): wmt mode


def line_of(path, needle, nth=1):
    """1-based line of the NTH line of PATH that contains NEEDLE (asserts it exists)."""
    hits = [i for i, line in enumerate(read_text(path).split("\n"), 1) if needle in line]
    assert len(hits) >= nth, (needle, path)
    return hits[nth - 1]


def wmt_side(open_tag, close, paras, prefix):
    lines = [open_tag]
    for para in paras:
        lines.append("<p>")
        lines += [f'<seg id="{sid}">{prefix}{text}</seg>' for sid, text in para]
        lines.append("</p>")
    return lines + [close]


def wmt_doc(docid, paras, refs=("A", "B"), hyps=("sysX", "sysY"), attrs='origlang="en"'):
    """A <doc> with a <src>, a <ref> per translator and a <hyp> per system; the
    reference text is 'T ' + source text, the hypothesis text 'SYSTEM ' + source text."""
    lines = [f'<doc id="{docid}" {attrs}>']
    lines += wmt_side('<src lang="en">', "</src>", paras, "")
    for t in refs:
        lines += wmt_side(f'<ref lang="de" translator="{t}">', "</ref>", paras, f"{t} ")
    for h in hyps:
        lines += wmt_side(f'<hyp system="{h}" language="de">', "</hyp>", paras, f"{h} ")
    return lines + ["</doc>"]


WMT_DOC1 = ("news.1", [[("1", "Tom &amp; Ann met."), ("2", "She said &quot;hi&quot; &lt;loudly&gt;.")],
                       [("3", "Caf&#233; closed.")]])
WMT_DOC2 = ("news.2", [[("1", "Rain."), ("2", "More rain.")]])
WMT_EN = ["Tom & Ann met.", 'She said "hi" <loudly>.', "Café closed.", "Rain.", "More rain."]


def wmt_file(path, docs=None, testsuite=True):
    """Two documents (news.1: refs A, B, two paragraphs; news.2: refs B, A) and a
    test-suite document without references; one element per line."""
    if docs is None:
        docs = [wmt_doc(*WMT_DOC1), wmt_doc(*WMT_DOC2, refs=("B", "A"))]
        if testsuite:
            docs.append(wmt_doc("suite.1", [[("1", "Suite.")]], refs=(),
                                attrs='origlang="en" testsuite="pronouns"'))
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<dataset id="wmttest2099">',
             '<collection id="general">']
    for d in docs:
        lines += d
    return write(path, "\n".join(lines + ["</collection>", "</dataset>"]) + "\n")


def wmt_args(xml, prefix, *extra):
    return ["wmt", "--xml", xml, "--src-lang", "en", "--tgt-lang", "de", "--out-prefix", prefix, *extra]


def test_wmt_happy_path(tmp_path, capsys):
    xml = wmt_file(tmp_path / "wmttest2099.en-de.xml")
    raw = read_text(xml)
    # an empty hypothesis segment is a valid system output: kept as an empty line
    old = '<seg id="2">sysX She said &quot;hi&quot; &lt;loudly&gt;.</seg>'
    assert raw.count(old) == 1
    write(xml, raw.replace(old, '<seg id="2"> </seg>'))
    prefix = str(tmp_path / "out" / "test")
    code, out, err = run_cli(wmt_args(xml, prefix, "--hyp-system", "sysX"), capsys)
    assert code == 0, err
    assert out.startswith(f"ctx-prep-docs: 2 documents, 5 sentences -> {prefix}.{{en,de,docids}} (")
    assert "translator A (1 document), translator B (1 document)" in out
    assert f"system sysX -> {prefix}.hyp.de" in out
    assert "1 document with a testsuite attribute skipped" in out
    assert read_lines(prefix + ".en") == WMT_EN
    # default: each document's first <ref> (A in news.1, B in news.2)
    assert read_lines(prefix + ".de") == ["A " + x for x in WMT_EN[:3]] + ["B " + x for x in WMT_EN[3:]]
    assert read_lines(prefix + ".docids") == ["news.1"] * 3 + ["news.2"] * 2
    assert read_lines(prefix + ".hyp.de") == ["sysX Tom & Ann met.", "", "sysX Café closed.",
                                              "sysX Rain.", "sysX More rain."]
    assert out_files(tmp_path / "out") == ["test.de", "test.docids", "test.en", "test.hyp.de"]
    # the library entry point gives the same and no hypothesis file without --hyp-system
    summary = pd.prepare_wmt(xml, "en", "de", str(tmp_path / "lib" / "t"))
    assert (summary.documents, summary.sentences, summary.hyp_file) == (2, 5, None)
    assert out_files(tmp_path / "lib") == ["t.de", "t.docids", "t.en"]
    assert read_lines(str(tmp_path / "lib" / "t.de")) == read_lines(prefix + ".de")


def test_wmt_ref_translator(tmp_path, capsys):
    xml = wmt_file(tmp_path / "w.xml")
    for who in ("A", "B"):
        prefix = str(tmp_path / who / "t")
        code, out, err = run_cli(wmt_args(xml, prefix, "--ref-translator", who), capsys)
        assert code == 0, err
        assert read_lines(prefix + ".de") == [f"{who} {x}" for x in WMT_EN]
        assert f"(reference: translator {who} (2 documents);" in out
    # a <ref> without translator attribute takes the one on <src> (as in wmt21 dev is-en)
    raw = read_text(xml).replace('<src lang="en">', '<src lang="en" translator="B">')
    raw = raw.replace('<ref lang="de" translator="B">', '<ref lang="de">')
    src_b = write(tmp_path / "srcb.xml", raw)
    prefix = str(tmp_path / "S" / "t")
    code, _, err = run_cli(wmt_args(src_b, prefix, "--ref-translator", "B"), capsys)
    assert code == 0, err
    assert read_lines(prefix + ".de") == [f"B {x}" for x in WMT_EN]


def test_wmt_missing_reference(tmp_path, capsys):
    docs = [wmt_doc(*WMT_DOC1), wmt_doc(*WMT_DOC2, refs=("B",))]
    xml = wmt_file(tmp_path / "w.xml", docs)
    out_dir = tmp_path / "out"
    line = line_of(xml, '<doc id="news.2"')
    err = assert_error(wmt_args(xml, str(out_dir / "t"), "--ref-translator", "A", "--hyp-system", "sysX"),
                       capsys, out_dir, xml, line, "document news.2 has no reference by translator A",
                       "(it has: B)", "--ref-translator")
    assert "news.1" not in err
    # B is in both documents: fine
    assert run_cli(wmt_args(xml, str(tmp_path / "ok" / "t"), "--ref-translator", "B"), capsys)[0] == 0
    # no <ref> at all
    bare = wmt_file(tmp_path / "bare.xml", [wmt_doc(*WMT_DOC1), wmt_doc(*WMT_DOC2, refs=())])
    assert_error(wmt_args(bare, str(out_dir / "t")), capsys, out_dir, bare,
                 line_of(bare, '<doc id="news.2"'), "document news.2 has no <ref>")
    # two references by the selected translator in one document
    dup = wmt_file(tmp_path / "dup.xml", [wmt_doc(*WMT_DOC1, refs=("A", "B", "A")), wmt_doc(*WMT_DOC2)])
    assert_error(wmt_args(dup, str(out_dir / "t"), "--ref-translator", "A"), capsys, out_dir, dup,
                 line_of(dup, '<ref lang="de" translator="A">', 2), "document news.1: second <ref",
                 f"first at line {line_of(dup, '<ref lang=' + chr(34) + 'de' + chr(34))}")


def test_wmt_missing_hyp(tmp_path, capsys):
    xml = wmt_file(tmp_path / "w.xml", [wmt_doc(*WMT_DOC1), wmt_doc(*WMT_DOC2, hyps=("sysY",))])
    out_dir = tmp_path / "out"
    assert_error(wmt_args(xml, str(out_dir / "t"), "--hyp-system", "sysX"), capsys, out_dir, xml,
                 line_of(xml, '<doc id="news.2"'), "document news.2 has no <hyp> of system sysX",
                 "(it has: sysY)", "--hyp-system")
    assert run_cli(wmt_args(xml, str(out_dir / "t"), "--hyp-system", "sysY"), capsys)[0] == 0


# (description, old, new, line of this (nth) occurrence of NEEDLE after the change, fragments)
WMT_ERRORS = [
    ("ref segment id", '<seg id="2">A She said', '<seg id="7">A She said', ('<seg id="7">', 1),
     ["document news.1, paragraph 1, segment 7", "segment #2 of <ref translator=\"A\"> has id 7",
      "expected segment id 2 as in <src> line"]),
    ("hyp segment id", '<seg id="1">sysX Rain.', '<seg id="9">sysX Rain.', ('<seg id="9">', 1),
     ["document news.2, paragraph 1, segment 9", "<hyp system=\"sysX\">", "expected segment id 1"]),
    ("ref segment missing", '<seg id="3">A Caf&#233; closed.</seg>', "", ("</ref>", 1),
     ["document news.1, paragraph 2: segment 3", "is missing in <ref translator=\"A\">",
      "2 segments, expected 3"]),
    ("extra ref segment", '<seg id="2">A More rain.</seg>',
     '<seg id="2">A More rain.</seg>\n<seg id="3">A Extra.</seg>', ("A Extra.", 1),
     ["document news.2, paragraph 1, segment 3: extra segment in <ref translator=\"A\">"]),
    ("paragraph boundary", '<seg id="2">A She said &quot;hi&quot; &lt;loudly&gt;.</seg>\n</p>\n<p>',
     '</p>\n<p>\n<seg id="2">A She said.</seg>', ("A She said.", 1),
     ["document news.1, segment 2: in paragraph 2 of <ref translator=\"A\">", "expected paragraph 1"]),
    ("empty reference segment", "A Rain.", " ", ('<seg id="1"> </seg>', 1),
     ["document news.2, segment 1: empty segment in <ref translator=\"A\">", "--allow-empty"]),
    ("wrong source language", '<doc id="news.2" origlang="en">\n<src lang="en">',
     '<doc id="news.2" origlang="en">\n<src lang="fr">', ('<src lang="fr">', 1),
     ['document news.2: <src> has lang="fr", but --src-lang is en']),
    ("duplicate document", 'doc id="news.2"', 'doc id="news.1"', ('<doc id="news.1"', 2),
     ["duplicate document id news.1", "first at line 4"]),
    ("seg outside src/ref/hyp", '<doc id="news.2" origlang="en">', '<doc id="news.2" origlang="en"><seg id="1">x</seg>',
     ('<doc id="news.2"', 1), ["document news.2: <seg> outside <src>, <ref> and <hyp>"]),
    ("malformed", "Rain.</seg>", "Rain & snow.</seg>", ("Rain & snow", 1), ["malformed XML", "not well-formed"]),
]


@pytest.mark.parametrize("case", WMT_ERRORS, ids=[c[0] for c in WMT_ERRORS])
def test_wmt_errors(case, tmp_path, capsys):
    _, old, new, (needle, nth), fragments = case
    xml = wmt_file(tmp_path / "w.xml", testsuite=False)
    raw = read_text(xml)
    assert old in raw
    write(xml, raw.replace(old, new, 1))
    out_dir = tmp_path / "out"
    assert_error(wmt_args(xml, str(out_dir / "t"), "--ref-translator", "A", "--hyp-system", "sysX"),
                 capsys, out_dir, xml, line_of(xml, needle, nth), *fragments)


def test_wmt_paragraph_boundaries(tmp_path, capsys):
    xml = wmt_file(tmp_path / "w.xml")
    prefix = str(tmp_path / "t")
    code, out, err = run_cli(wmt_args(xml, prefix, "--paragraph-boundaries", "--hyp-system", "sysY"), capsys)
    assert code == 0, err
    assert "3 documents, 5 sentences" in out and "documents are the paragraphs of 2 documents" in out
    assert read_lines(prefix + ".docids") == ["news.1.p1", "news.1.p1", "news.1.p2", "news.2.p1", "news.2.p1"]
    assert read_lines(prefix + ".en") == WMT_EN
    assert read_lines(prefix + ".hyp.de") == ["sysY " + x for x in WMT_EN]
    assert pd.read_docids(prefix + ".docids")[2] == "news.1.p2"
    # without the option the paragraphs of a document stay one document
    code, out, _ = run_cli(wmt_args(xml, prefix), capsys)
    assert code == 0 and "2 documents, 5 sentences" in out
    assert read_lines(prefix + ".docids") == ["news.1"] * 3 + ["news.2"] * 2


def test_wmt_language_codes_and_segments_outside_p(tmp_path, capsys):
    """lang="en" matches --src-lang en_XX (mBART-style codes); segments written
    directly in <src>/<ref> (no <p>) form one paragraph."""
    lines = ['<dataset id="x">', '<doc id="a" origlang="en">', '<src lang="en"><seg id="1">One.</seg>',
             '<seg id="2">Two.</seg></src>', '<ref lang="de"><seg id="1">Eins.</seg><seg id="2">Zwei.</seg></ref>',
             "</doc>", "</dataset>"]
    xml = write(tmp_path / "w.xml", "\n".join(lines) + "\n")
    prefix = str(tmp_path / "t")
    code, out, err = run_cli(["wmt", "--xml", xml, "--src-lang", "en_XX", "--tgt-lang", "de_DE",
                              "--out-prefix", prefix, "--paragraph-boundaries"], capsys)
    assert code == 0, err
    assert read_lines(prefix + ".de_DE") == ["Eins.", "Zwei."]
    assert read_lines(prefix + ".docids") == ["a.p1", "a.p1"]
    assert "translator (no translator attribute) (1 document)" in out


def test_wmt_write_failure_leaves_nothing(tmp_path, monkeypatch):
    """The hypothesis file is written atomically with the other three."""
    xml = wmt_file(tmp_path / "w.xml")
    out_dir = tmp_path / "out"
    real = os.fdopen
    calls = []

    def failing_fdopen(fd, *a, **k):
        calls.append(fd)
        if len(calls) == 4:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real(fd, *a, **k)

    monkeypatch.setattr(pd.os, "fdopen", failing_fdopen)
    with pytest.raises(OSError):
        pd.prepare_wmt(xml, "en", "de", str(out_dir / "t"), hyp_system="sysX")
    assert len(calls) == 4 and out_files(out_dir) == []


def test_xml_mode_rejects_wmt_file(tmp_path, capsys):
    xml = wmt_file(tmp_path / "w.xml")
    other = xml_file(tmp_path / "t.xml", TGT_DOCS)
    out_dir = tmp_path / "out"
    line = line_of(xml, "<dataset")
    for src, tgt in ((xml, xml), (xml, other), (other, xml)):
        err = assert_error(xml_args(src, tgt, str(out_dir / "p")), capsys, out_dir, xml, line,
                           "WMT test-set XML", "ctx-prep-docs wmt --xml FILE")
        assert "without a docid" not in err
    assert_error(["sgml", "--src-sgm", xml, "--tgt-sgm", xml, "--src-lang", "en", "--tgt-lang", "de",
                  "--out-prefix", str(out_dir / "p")], capsys, out_dir, xml, line, "ctx-prep-docs wmt")
    # and the other way round: an mteval/IWSLT file given to wmt mode
    assert_error(wmt_args(other, str(out_dir / "p")), capsys, out_dir, other, 2,
                 "root element <mteval>; expected <dataset>", "use `ctx-prep-docs xml`")


# ---------------------------------------------------------------------------
# WMT .sgm (before 2021): sgml mode

SRC_SGM = (
    '<srcset setid="newstest2099" srclang="any">\n'
    '<doc sysid="ref" docid="bbc.1" genre="news" origlang="en">\n'
    "<p>\n"
    "<seg id=1>AT&T &amp; R&amp;D say &quot;hi&quot; &#39;twice&#39; &#x263A; 3 < 4 &amp;amp;</seg>\n"
    '<seg id="2">No closing tag here\n'
    "<seg id='3'>A segment over\n"
    "   two lines</seg>\n"
    "</p>\n"
    '<doc docid="cnn.2" genre="news">\n'
    '<seg id="1">Fish &copy chips &foo; &lt;b&gt;</seg>\n'
    '<seg id="2">Two &amp; a half<seg id="3">Three</seg> <seg id="4">Four</p>\n'
    "</doc>\n"
    "</srcset>\n"
)
TGT_SGM = (
    '<refset setid="newstest2099" srclang="any" trglang="de">\n'
    '<doc sysid="ref" docid="bbc.1" genre="news" origlang="en">\n'
    '<p>\n<seg id="1">Eins</seg>\n<seg id="2">Zwei</seg>\n<seg id="3">Drei</seg>\n</p>\n</doc>\n'
    '<doc sysid="ref" docid="cnn.2" genre="news">\n<seg id="1">Vier</seg>\n<seg id="2">F</seg>\n'
    '<seg id="3">S</seg>\n<seg id="4">V</seg>\n</doc>\n'
    "</refset>\n"
)
SGM_EN = ["AT&T & R&D say \"hi\" 'twice' \u263a 3 < 4 &amp;", "No closing tag here",
          "A segment over two lines", "Fish &copy chips &foo; <b>", "Two & a half", "Three", "Four"]


def sgml_args(src, tgt, prefix, *extra):
    return ["sgml", "--src-sgm", src, "--tgt-sgm", tgt, "--src-lang", "en", "--tgt-lang", "de",
            "--out-prefix", prefix, *extra]


def test_sgml_tolerant(tmp_path, capsys):
    src = write(tmp_path / "newstest2099-ende-src.en.sgm", SRC_SGM)
    tgt = write(tmp_path / "newstest2099-ende-ref.de.sgm", TGT_SGM)
    prefix = str(tmp_path / "out" / "t")
    code, out, err = run_cli(sgml_args(src, tgt, prefix), capsys)
    assert code == 0, err
    assert "2 documents, 7 sentences" in out and "1 line breaks inside sentences replaced" in out
    assert read_lines(prefix + ".en") == SGM_EN
    assert read_lines(prefix + ".de") == ["Eins", "Zwei", "Drei", "Vier", "F", "S", "V"]
    assert read_lines(prefix + ".docids") == ["bbc.1"] * 3 + ["cnn.2"] * 4
    assert pd.read_sgml_documents(src)[1] == ("cnn.2", [("1", SGM_EN[3]), ("2", SGM_EN[4]),
                                                        ("3", SGM_EN[5]), ("4", SGM_EN[6])])
    with pytest.raises(ValueError, match="entities must be one of"):
        pd.read_sgml_documents(src, entities="latin1")
    # the same files are not XML: xml mode fails and points to sgml mode
    out_dir = tmp_path / "x"
    assert_error(xml_args(src, tgt, str(out_dir / "t")), capsys, out_dir, src, 4, "malformed XML",
                 "ctx-prep-docs sgml")


def test_unescape_entities():
    u = pd._unescape_entities
    assert u("a &amp; b &lt;&gt; &quot;&apos; &#39; &#x41;&#X42;") == "a & b <> \"' ' AB"
    assert u("AT&T & R&D &amp;amp; &copy &foo; &#0; &#xD800; &#99999999;") == \
        "AT&T & R&D &amp; &copy &foo; &#0; &#xD800; &#99999999;"
    assert u("&eacute;t&eacute;&nbsp;") == "été\xa0"
    # entities="xml": the five XML entities only (the sentence-level recipes' .sgm text)
    assert u("a &amp;lt; &lt;&gt;&quot;&apos; &#39; &nbsp; AT&T &AMP;", "xml") == \
        "a &lt; <>\"' &#39; &nbsp; AT&T &AMP;"


def test_sgml_pair_errors(tmp_path, capsys):
    src = write(tmp_path / "s.sgm", SRC_SGM)
    out_dir = tmp_path / "out"
    cases = [  # (change to TGT_SGM, needle giving the line in the target, fragments)
        (('<seg id="2">Zwei', '<seg id="5">Zwei'), '<seg id="5">',
         ["document bbc.1, segment 5", "expected segment id 2", f"{src}:5"]),
        (('<seg id="3">Drei</seg>\n', ""), "</doc>", ["document bbc.1: segment 3", "is missing",
                                                      "2 segments, expected 3"]),
        (('docid="cnn.2"', 'docid="cnn.3"'), 'docid="cnn.3"', ["document cnn.3 is document #2",
                                                              "expected document cnn.2"]),
        (('<seg id="1">Vier</seg>', '<seg id="1"> &#32; </seg>'), "&#32;",
         ["document cnn.2, segment 1", "empty segment", "--allow-empty"]),
        (('<seg id="3">Drei', '</doc>\n<seg id="3">Drei'), '<seg id="3">Drei', ["<seg> outside any <doc>"]),
        (('<doc sysid="ref" docid="cnn.2"', '<doc sysid="ref" id="cnn.2"'), 'id="cnn.2"',
         ["<doc> without a docid attribute"]),
    ]
    for (old, new), needle, frags in cases:
        assert old in TGT_SGM
        tgt = write(tmp_path / "t.sgm", TGT_SGM.replace(old, new, 1))
        assert_error(sgml_args(src, tgt, str(out_dir / "t")), capsys, out_dir, tgt,
                     line_of(tgt, needle), *frags)
    # a missing document is reported at the end of the shorter file
    tgt = write(tmp_path / "t.sgm", TGT_SGM.split('<doc sysid="ref" docid="cnn.2"')[0] + "</refset>\n")
    assert_error(sgml_args(src, tgt, str(out_dir / "t")), capsys, out_dir, tgt, 9,
                 "document cnn.2", "is missing", "ends after 1 documents, expected 2")
    # not UTF-8: the line of the bad byte
    bad = tmp_path / "bad.sgm"
    bad.write_bytes(TGT_SGM.replace("Vier", "V\xefer").encode("latin-1"))
    assert_error(sgml_args(src, str(bad), str(out_dir / "t")), capsys, out_dir, str(bad), 10, "not UTF-8")
    # the unchanged pair works
    assert run_cli(sgml_args(src, write(tmp_path / "t.sgm", TGT_SGM), str(out_dir / "t")), capsys)[0] == 0


# ---------------------------------------------------------------------------
# tags mode (IWSLT train.tags files)


def tags_args(src, tgt, prefix, *extra):
    return ["tags", "--src", src, "--tgt", tgt, "--src-lang", "en", "--tgt-lang", "de",
            "--out-prefix", prefix, *extra]


def tags_file(path, talks, lang):
    """A train.tags-like file: per talk its metadata lines, then its lines."""
    out = []
    for talkid, lines in talks:
        out += [f"<url>http://www.ted.com/talks/t{talkid}</url>",
                "<keywords>talks, science</keywords>", "<speaker>A Speaker</speaker>",
                f"<talkid>{talkid}</talkid>", f"<title>Title {talkid} ({lang})</title>",
                "<description>TED Talk Subtitles and Transcript: about it</description>"]
        out += [f"{x} ({lang})" for x in lines]
    return write(path, "\n".join(out) + "\n")


TALKS = [("1", ["a1", "a2", "a3"]), ("2", ["b1"]), ("1441", ["c1", "c2"])]


def test_tags_mode(tmp_path, capsys):
    src = tags_file(tmp_path / "train.tags.en-de.en", TALKS, "en")
    tgt = tags_file(tmp_path / "train.tags.en-de.de", TALKS, "de")
    prefix = str(tmp_path / "out" / "train")
    code, out, err = run_cli(tags_args(src, tgt, prefix), capsys)
    assert code == 0, err
    assert "3 documents, 6 sentences" in out and "skipped" not in out
    assert read_lines(prefix + ".docids") == ["1", "1", "1", "2", "1441", "1441"]
    assert read_lines(prefix + ".en") == ["a1 (en)", "a2 (en)", "a3 (en)", "b1 (en)",
                                          "c1 (en)", "c2 (en)"]
    assert read_lines(prefix + ".de")[3] == "b1 (de)"  # titles/descriptions are metadata
    docs, replaced, skipped = pd.load_tags(src, tgt)
    assert [d for d, _ in docs] == ["1", "2", "1441"] and skipped == [] and replaced == 0


def test_tags_universal_newlines(tmp_path):
    """A stray \\r inside a transcript line: a line break for fairseq-preprocess's
    reading (the default), a space when lines end at \\n only."""
    src = write(tmp_path / "s.en", "<talkid>1</talkid>\nfirst\rsecond\nthird\n")
    tgt = write(tmp_path / "s.de", "<talkid>1</talkid>\nerste zweite\ndritte\n")
    with pytest.raises(pd.PrepDocsError, match="file ends after 3 lines; expected 4"):
        pd.load_tags(src, tgt)
    docs, replaced, _ = pd.load_tags(src, tgt, universal_newlines=False)
    assert docs == [("1", [("first second", "erste zweite"), ("third", "dritte")])] and replaced == 1


def test_tags_docid_lines_closing_tags_and_talks_without_text(tmp_path, capsys):
    """<doc docid=..> / </doc> lines (some releases have them) are metadata; a
    talk without transcript lines is skipped and counted; surrounding blanks
    stripped."""
    def text(lang):
        return (f'<doc docid="7" genre="lectures">\n<url>u</url>\n  <title>t</title>\n'
                f' x1 ({lang}) \nx2 ({lang})\n</doc>\n<doc docid="8">\n<talkid>8</talkid>\n</doc>\n'
                f'<url>u</url>\n<talkid>9</talkid>\ny1 ({lang})\n</doc>\n')
    src = write(tmp_path / "s.en", text("en"))
    tgt = write(tmp_path / "t.de", text("de"))
    prefix = str(tmp_path / "p")
    code, out, err = run_cli(tags_args(src, tgt, prefix), capsys)
    assert code == 0, err
    assert "2 documents, 3 sentences" in out
    assert "1 talk without transcript lines skipped: 8" in out
    assert read_lines(prefix + ".docids") == ["7", "7", "9"]
    assert read_lines(prefix + ".en") == ["x1 (en)", "x2 (en)", "y1 (en)"]


def test_tags_errors(tmp_path, capsys):
    out_dir = tmp_path / "out"
    prefix = str(out_dir / "p")
    good = "<url>u</url>\n<talkid>1</talkid>\na\nb\n<url>v</url>\n<talkid>2</talkid>\nc\n"
    src = write(tmp_path / "s.en", good)
    cases = [  # (target text, file at fault, line, fragments)
        (good.replace("<talkid>2", "<talkid>3").replace("2</talkid>", "3</talkid>"), "t", 6,
         ["talk id(s) 3", "expected 2 as in"]),
        (good.replace("b\n", "<b>\n"), "t", 4, ["metadata line", "is a transcript line"]),
        (good.replace("<url>v</url>", "v"), "t", 5, ["transcript line where", "is a metadata line"]),
        (good.replace("\nc\n", "\n\n"), "t", 7, ["talk 2: empty transcript line", "--allow-empty"]),
        (good[:-2], "t", 6, ["file ends after 6 lines", "expected 7 lines"]),
    ]
    for text, where, line, frags in cases:
        tgt = write(tmp_path / "t.de", text)
        assert_error(tags_args(src, tgt, prefix), capsys, out_dir, src if where == "s" else tgt,
                     line, *frags)
    # errors found in the source file (the target mirrors it)
    cases = [
        ("a\n<url>u</url>\n<talkid>1</talkid>\nb\n", 1, ["transcript line before any talk"]),
        ("<url>u</url>\na\n", 1, ["names no talk", "<talkid>N</talkid>"]),
        ("<talkid>1</talkid>\na\n<talkid>1</talkid>\nb\n", 3, ["duplicate talk id 1",
                                                               "first at line 1"]),
        ("<talkid>a b</talkid>\na\n", 1, ["talk id 'a b' contains whitespace"]),
        ("<talkid></talkid>\na\n", 1, ["empty talk id"]),
        ("<url>u</url>\n<talkid>1</talkid>\n", 1, ["no transcript lines"]),
        ("", 1, ["empty file"]),
    ]
    for text, line, frags in cases:
        s2 = write(tmp_path / "s2.en", text)
        t2 = write(tmp_path / "t2.de", text)
        assert_error(tags_args(s2, t2, prefix), capsys, out_dir, s2, line, *frags)
    tgt = write(tmp_path / "t.de", good)
    code, _, err = run_cli(tags_args(src, tgt, prefix), capsys)
    assert code == 0, err


def test_tags_allow_empty(tmp_path, capsys):
    src = write(tmp_path / "s.en", "<talkid>5</talkid>\na\n \nb\n")
    tgt = write(tmp_path / "t.de", "<talkid>5</talkid>\nA\nB0\nB\n")
    prefix = str(tmp_path / "p")
    code, _, err = run_cli(tags_args(src, tgt, prefix, "--allow-empty"), capsys)
    assert code == 0, err
    assert read_lines(prefix + ".en") == ["a", "", "b"]
    assert read_lines(prefix + ".de") == ["A", "B0", "B"]
