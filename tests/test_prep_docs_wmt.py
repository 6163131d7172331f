"""ctx-prep-docs on WMT test-set XML (documents, references, systems,
paragraphs, errors), tolerant SGML pairs and TED train.tags."""

import pytest

from ctx_fairseq.prep import docs as pd
from ctx_fairseq.data.docids import read_docid_lines

from prep_docs_utils import (
    TGT_DOCS, assert_error, fail_nth_fdopen, out_files, read_lines, read_text, run_cli, run_ok,
    write, xml_args, xml_file)


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
    out = run_ok(wmt_args(xml, prefix, "--hyp-system", "sysX"), capsys)
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
    assert read_docid_lines(prefix + ".docids")[2] == "news.1.p2"
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
    out = run_ok(["wmt", "--xml", xml, "--src-lang", "en_XX", "--tgt-lang", "de_DE",
                  "--out-prefix", prefix, "--paragraph-boundaries"], capsys)
    assert read_lines(prefix + ".de_DE") == ["Eins.", "Zwei."]
    assert read_lines(prefix + ".docids") == ["a.p1", "a.p1"]
    assert "translator (no translator attribute) (1 document)" in out


def test_wmt_write_failure_leaves_nothing(tmp_path, monkeypatch):
    """The hypothesis file is written atomically with the other three."""
    xml = wmt_file(tmp_path / "w.xml")
    out_dir = tmp_path / "out"
    calls = fail_nth_fdopen(monkeypatch, 4)
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
    out = run_ok(sgml_args(src, tgt, prefix), capsys)
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
    out = run_ok(tags_args(src, tgt, prefix), capsys)
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
    out = run_ok(tags_args(src, tgt, prefix), capsys)
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
