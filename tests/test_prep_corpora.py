"""ctx_fairseq.prep.corpora: the document readers of the corpus recipes
(<d>-delimited files, Europarl session files, OPUS alignments), their errors
(file and line named), filtering, splitting and the generate post-processing."""

import gzip
import json
import os
import zipfile

import pytest

from ctx_fairseq.prep import corpora as pc
from ctx_fairseq.prep.opus import OpusOptions
from ctx_fairseq.data.docids import DocFileError as PrepDocsError


def write(path, text, gz=False):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    data = text.encode("utf-8")
    if gz:
        data = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def assert_error_at(where, what, load, *args, **kwargs):
    """``load(*args, **kwargs)`` raises a PrepDocsError whose message starts
    with ``where`` (the file, and line, it names) and says ``what``."""
    with pytest.raises(PrepDocsError) as e:
        load(*args, **kwargs)
    assert str(e.value).startswith(where), str(e.value)
    assert what in str(e.value)


# ---------------------------------------------------------------- <d> format

def test_doc_delimited(tmp_path):
    src = write(tmp_path / "a.en", "<d>\nHello  there.\nSecond.\n<d>\nThird.\n")
    tgt = write(tmp_path / "a.de", "<d>\nHallo.\nZweiter.\n <d> \nDritter.\n")
    docs, stats = pc.load_doc_delimited(src, tgt, doc_prefix="nc")
    assert docs == [("nc00000", [("Hello there.", "Hallo."), ("Second.", "Zweiter.")]),
                    ("nc00001", [("Third.", "Dritter.")])]
    assert stats.counts["documents read"] == 2 and stats.counts["sentences read"] == 3


@pytest.mark.parametrize("src,tgt,where,what", [
    ("<d>\na\n<d>\n<d>\nb\n", "<d>\na\n<d>\nb\n", "a.en:4", "empty document: the '<d>' of line 3"),
    ("<d>\na\n\nb\n", "<d>\na\nb\nc\n", "a.en:3", "empty line"),
    ("x\n<d>\na\n", "<d>\na\n", "a.en:1", "text before the first '<d>'"),
    ("<d>\na\n<d>\n", "<d>\na\n<d>\nb\n", "a.en:3", "empty document at the end"),
    ("<d>\na\nb\n<d>\nc\n", "<d>\na\n<d>\nb\nc\n", "a.en:1", "document 1 has 2 sentences here and 1"),
    ("<d>\na\n", "<d>\na\n<d>\nb\n", "a.de", "2 documents, but"),
    ("", "<d>\na\n", "a.en", "empty file"),
])
def test_doc_delimited_errors(tmp_path, src, tgt, where, what):
    s = write(tmp_path / "a.en", src)
    t = write(tmp_path / "a.de", tgt)
    assert_error_at(str(tmp_path / where), what, pc.load_doc_delimited, s, t)


def test_not_utf8_names_the_line(tmp_path):
    s = tmp_path / "a.en"
    s.write_bytes(b"<d>\nok\n\xff\n")
    t = write(tmp_path / "a.de", "<d>\na\nb\n")
    with pytest.raises(PrepDocsError, match=r"a\.en:3: not UTF-8"):
        pc.load_doc_delimited(str(s), t)


# ------------------------------------------------------------- Europarl sessions

SESSION_EN = """<CHAPTER ID="1">
Resumption of the session
<SPEAKER ID="1" NAME="President">
I declare resumed the session.
<P>
Please rise.

<SPEAKER ID="2" NAME="Evans, Robert (PSE)" LANGUAGE="EN">
Madam President, on a point of order.
Thank you.
<CHAPTER ID="2">
Agenda
"""
SESSION_DE = """<CHAPTER ID="1">
Wiederaufnahme der Sitzungsperiode
<SPEAKER ID="1" NAME="Präsidentin">
Ich erkläre die Sitzung für wiederaufgenommen.
<P>
Bitte erheben Sie sich.

<SPEAKER ID="2" NAME="Evans, Robert (PSE)" LANGUAGE="EN">
Frau Präsidentin, zur Geschäftsordnung.

<CHAPTER ID="2">
Tagesordnung
"""


def test_sessions_speaker_turns(tmp_path):
    write(tmp_path / "en" / "ep-00-01-17.txt", SESSION_EN)
    write(tmp_path / "de" / "ep-00-01-17.txt", SESSION_DE)
    docs, stats = pc.load_aligned_sessions(str(tmp_path / "en"), str(tmp_path / "de"))
    assert docs == [
        ("ep-00-01-17.t0000", [("Resumption of the session", "Wiederaufnahme der Sitzungsperiode")]),
        ("ep-00-01-17.t0001", [("I declare resumed the session.",
                                "Ich erkläre die Sitzung für wiederaufgenommen."),
                               ("Please rise.", "Bitte erheben Sie sich.")]),
        ("ep-00-01-17.t0002", [("Madam President, on a point of order.",
                                "Frau Präsidentin, zur Geschäftsordnung.")]),
        ("ep-00-01-17.t0003", [("Agenda", "Tagesordnung")]),
    ]
    c = stats.counts
    assert c["<SPEAKER> boundaries"] == 2 and c["<CHAPTER> boundaries"] == 2
    assert c["markup lines dropped: <P>"] == 1
    assert c["line pairs with one empty side dropped"] == 1  # "Thank you." has no translation
    assert stats.examples["line pairs with one empty side dropped"].endswith("ep-00-01-17.txt:10")
    assert c["documents outside speaker turns (e.g. chapter titles)"] == 2
    assert c["blank line pairs skipped"] == 1


def test_sessions_file_unit(tmp_path):
    write(tmp_path / "en" / "doc-a", "<P>\nOne.\nTwo.\n")
    write(tmp_path / "de" / "doc-a", "<P>\nEins.\nZwei.\n")
    write(tmp_path / "en" / "doc-b.txt", "Three.\n")
    write(tmp_path / "de" / "doc-b.txt", "Drei.\n")
    docs, stats = pc.load_aligned_sessions(str(tmp_path / "en"), str(tmp_path / "de"), unit="file")
    assert docs == [("doc-a", [("One.", "Eins."), ("Two.", "Zwei.")]),
                    ("doc-b", [("Three.", "Drei.")])]
    assert stats.counts["markup lines dropped: <P>"] == 1


@pytest.mark.parametrize("en,de,where,what", [
    ("<SPEAKER ID=1>\na\n", "b\nc\n", "en/s.txt:1", "markup line '<SPEAKER ID=1>', but line 1"),
    ("<SPEAKER ID=1>\na\n", "<SPEAKER ID=2>\nb\n", "en/s.txt:1", "SPEAKER ID '1' here but '2'"),
    ("<SPEAKER ID=1>\na\n", "<CHAPTER ID=1>\nb\n", "en/s.txt:1", "<SPEAKER> here but <CHAPTER>"),
    ("<SPEAKER ID=1>\na\nb\n", "<SPEAKER ID=1>\na\n", "de/s.txt", "2 lines, but"),
    ("a\nb\n", "c\nd\n", "en", "no <SPEAKER> line"),
])
def test_sessions_errors(tmp_path, en, de, where, what):
    write(tmp_path / "en" / "s.txt", en)
    write(tmp_path / "de" / "s.txt", de)
    assert_error_at(str(tmp_path / where), what, pc.load_aligned_sessions,
                    str(tmp_path / "en"), str(tmp_path / "de"))


def test_sessions_missing_file(tmp_path):
    write(tmp_path / "en" / "a.txt", "<SPEAKER ID=1>\nx\n")
    write(tmp_path / "de" / "b.txt", "<SPEAKER ID=1>\ny\n")
    with pytest.raises(PrepDocsError, match=r"2 file\(s\) not in both directories: a\.txt \(only in"):
        pc.load_aligned_sessions(str(tmp_path / "en"), str(tmp_path / "de"))


# ------------------------------------------------------------------------ OPUS

def subtitle(sents):
    """OPUS OpenSubtitles XML: sents = [(id, start, end, words)] (times 'HH:MM:SS,mmm' or None)."""
    out = ['<?xml version="1.0" encoding="utf-8"?>', '<document id="1">']
    for sid, start, end, words in sents:
        out.append(f'  <s id="{sid}">')
        if start:
            out.append(f'    <time id="T{sid}S" value="{start}" />')
        for i, w in enumerate(words.split(), 1):
            out.append(f'    <w id="{sid}.{i}">{w}</w>')
        if end:
            out.append(f'    <time id="T{sid}E" value="{end}" />')
        out.append("  </s>")
    out.append("</document>")
    return "\n".join(out) + "\n"


def alignment(groups):
    out = ['<?xml version="1.0" encoding="utf-8"?>', '<!DOCTYPE cesAlign PUBLIC "-//CES//DTD XML cesAlign//EN" "">',
           '<cesAlign version="1.0">']
    for from_doc, to_doc, links in groups:
        out.append(f' <linkGrp targType="s" fromDoc="{from_doc}" toDoc="{to_doc}">')
        for i, (xt, ov) in enumerate(links):
            ov_attr = f' overlap="{ov}"' if ov is not None else ""
            out.append(f'  <link id="SL{i}" xtargets="{xt}"{ov_attr} />')
        out.append(" </linkGrp>")
    out.append("</cesAlign>")
    return "\n".join(out) + "\n"


def opus_fixture(tmp_path, gz=True):
    en = subtitle([("1", "00:00:01,000", "00:00:02,000", "Where is it ?"),
                   ("2", "00:00:02,500", "00:00:04,000", "It 's here ."),
                   ("3", "00:00:20,000", "00:00:21,000", "Much later ."),   # 16 s after 2's end
                   ("4", "00:00:21,500", "00:00:22,000", "Next one ."),
                   ("5", "00:00:22,500", "00:00:23,000", "Low overlap ."),
                   ("6", "00:00:23,500", "00:00:24,000", "Two"),
                   ("7", None, "00:00:25,000", "sentences ."),
                   ("8", "00:00:26,000", "00:00:27,000", "Last ."),
                   ("9", "00:00:27,500", "00:00:28,000", "After it .")])
    ru = subtitle([(str(i), None, None, w) for i, w in enumerate(
        ["Где он ?", "Он здесь .", "Гораздо позже .", "Следующий .", "Мало .",
         "Два предложения .", "Последний .", "После него ."], 1)])
    write(tmp_path / "docs" / "en" / "1999" / "123" / "42.xml.gz", en, gz=True)
    write(tmp_path / "docs" / "ru" / "1999" / "123" / "77.xml", ru)
    links = [("1;1", 0.98), ("2;2", 0.95), ("3;3", 0.97), ("4;4", 0.99), ("5;5", 0.5),
             ("6 7;6", 0.96), ("8;7", 1.0), ("9;8", 0.93)]
    ali = write(tmp_path / ("en-ru.xml.gz" if gz else "en-ru.xml"),
                alignment([("en/1999/123/42.xml.gz", "ru/1999/123/77.xml.gz", links)]), gz=gz)
    return ali


def test_opus_voita_filtering(tmp_path):
    ali = opus_fixture(tmp_path)
    c = pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru",
                     OpusOptions(min_overlap=0.9, max_gap=7))
    assert c.docs == [
        ("1999/123/42.r0000", [("Where is it ?", "Где он ?"), ("It 's here .", "Он здесь .")]),
        ("1999/123/42.r0001", [("Much later .", "Гораздо позже ."), ("Next one .", "Следующий .")]),
        ("1999/123/42.r0002", [("Last .", "Последний ."), ("After it .", "После него .")]),
    ]
    assert set(c.groups.values()) == {"1999/123"}
    k = c.stats.counts
    assert k["links dropped: overlap below 0.9"] == 1
    assert k["links dropped: not 1:1"] == 1
    assert k["runs ended: time gap above 7s"] == 1
    assert k["sentences with a previous sentence as context"] == 3


def test_opus_gap_from_end_and_all_links(tmp_path):
    ali = opus_fixture(tmp_path, gz=False)
    c = pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru",
                     OpusOptions(min_overlap=0.9, max_gap=1, gap_from="end", one_to_one=False))
    # 2 ends at 4.0, 3 starts at 20: new run; 5 dropped (overlap); 6+7 kept as one pair (7 has
    # no start of its own: it inherits 6's frame), 8 starts 1 s after 7's end: same run
    assert [len(p) for _, p in c.docs] == [2, 2, 3]
    assert c.docs[2][1][0] == ("Two sentences .", "Два предложения .")
    c = pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")  # no filter but 1:1 links
    assert [len(p) for _, p in c.docs] == [5, 2]
    assert c.stats.counts["runs ended by a dropped link"] == 1


def test_opus_swapped_sides_and_zip(tmp_path):
    """OPUS orders the pair alphabetically: de-en.xml has fromDoc de/...; documents in zip files
    under CORPUS/raw/LANG/..., Europarl SPEAKER elements delimit documents."""
    en = ('<?xml version="1.0"?><text><CHAPTER ID="1"><P id="1"><s id="1">Title</s></P></CHAPTER>'
          '<CHAPTER ID="2"><SPEAKER ID="1" NAME="President"/><P id="2"><s id="2">A one.</s>'
          '<s id="3">A two.</s></P><SPEAKER ID="2" NAME="X"/><P id="3"><s id="4">B one.</s></P>'
          '</CHAPTER></text>')
    de = ('<?xml version="1.0"?><text><s id="1">Titel</s><s id="2">A eins.</s><s id="3">A zwei.'
          '</s><s id="4">B eins.</s></text>')
    for lang, text in (("en", en), ("de", de)):
        with zipfile.ZipFile(tmp_path / f"{lang}.zip", "w") as z:
            z.writestr(f"Europarl/raw/{lang}/ep-00-01-17.xml", text)
    ali = write(tmp_path / "de-en.xml", alignment([(
        "de/ep-00-01-17.xml.gz", "en/ep-00-01-17.xml.gz",
        [("1;1", None), ("2;2", None), ("3;3", None), ("4;4", None)])]))
    c = pc.load_opus(ali, [str(tmp_path / "en.zip"), str(tmp_path / "de.zip")], "en", "de",
                     OpusOptions(boundary_tags=["SPEAKER", "CHAPTER"], require_boundaries=True))
    assert c.docs == [("ep-00-01-17.r0000", [("Title", "Titel")]),
                      ("ep-00-01-17.r0001", [("A one.", "A eins."), ("A two.", "A zwei.")]),
                      ("ep-00-01-17.r0002", [("B one.", "B eins.")])]
    assert c.groups["ep-00-01-17.r0001"] == "ep-00-01-17"
    c0 = pc.load_opus(ali, [str(tmp_path / "en.zip"), str(tmp_path / "de.zip")], "en", "de",
                      OpusOptions(boundary_tags=["SPEAKER", "CHAPTER"], group_depth=0))
    assert c0.groups["ep-00-01-17.r0001"] == "ep-00-01-17.r0001"
    assert c.stats.counts["runs ended: boundary element"] == 2
    # no boundary markup in a document that must have it: an error naming the document
    with zipfile.ZipFile(tmp_path / "en.zip", "w") as z:
        z.writestr("Europarl/raw/en/ep-00-01-17.xml", de.replace("Titel", "Title"))
    with pytest.raises(PrepDocsError, match=r"en\.zip:Europarl/raw/en/ep-00-01-17\.xml: no "
                                            r"<SPEAKER>/<CHAPTER> element"):
        pc.load_opus(ali, [str(tmp_path / "en.zip"), str(tmp_path / "de.zip")], "en", "de",
                     OpusOptions(boundary_tags=["SPEAKER", "CHAPTER"], require_boundaries=True))


@pytest.mark.parametrize("links,line,what", [
    ([("1;1", None)], 5, "without an overlap attribute"),
    ([("1;1", 0.9), ("12;2", 0.9)], 6, "sentence id 12 is not in"),
    ([("1-1", 0.9)], 5, "xtargets='1-1'; expected 'IDS;IDS'"),
    ([("1;1", "high")], 5, "overlap='high'; expected a number"),
])
def test_opus_errors(tmp_path, links, line, what):
    opus_fixture(tmp_path)
    ali = write(tmp_path / "bad.xml", alignment([("en/1999/123/42.xml.gz", "ru/1999/123/77.xml.gz",
                                                   links)]))
    assert_error_at(f"{ali}:{line}: ", what, pc.load_opus, ali, [str(tmp_path / "docs")], "en",
                    "ru", OpusOptions(min_overlap=0.5))


def test_opus_structural_errors(tmp_path):
    opus_fixture(tmp_path)
    ali = write(tmp_path / "x.xml", alignment([("en/1999/123/42.xml.gz", "fr/1999/1/1.xml.gz",
                                                [("1;1", 1)])]))
    with pytest.raises(PrepDocsError, match=r"x\.xml:4: linkGrp .*languages en-fr; expected en and ru"):
        pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")
    ali = write(tmp_path / "y.xml", alignment([("en/1999/9/9.xml.gz", "ru/1999/123/77.xml.gz",
                                                [("1;1", 1)])]))
    with pytest.raises(PrepDocsError, match=r"y\.xml:4: document en/1999/9/9\.xml\.gz not found"):
        pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")
    ali = write(tmp_path / "z.xml", '<cesAlign>\n<linkGrp fromDoc="a">\n</cesAlign>\n')
    with pytest.raises(PrepDocsError, match=r"z\.xml:2: <linkGrp> without toDoc"):
        pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")
    ali = write(tmp_path / "m.xml", '<cesAlign>\n<linkGrp fromDoc="a" toDoc="b">\n</cesAlign>\n')
    with pytest.raises(PrepDocsError, match=r"m\.xml:3: malformed XML"):
        pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")
    bad = write(tmp_path / "docs" / "en" / "1999" / "123" / "42.xml",
                '<document>\n<s id="1"><w>a</w></s>\n<s id="1"><w>b</w></s>\n</document>\n')
    os.remove(tmp_path / "docs" / "en" / "1999" / "123" / "42.xml.gz")
    ali = write(tmp_path / "ok.xml", alignment([("en/1999/123/42.xml.gz", "ru/1999/123/77.xml.gz",
                                                 [("1;1", 1)])]))
    with pytest.raises(PrepDocsError, match=f"{bad}:3: sentence id 1 used twice"):
        pc.load_opus(ali, [str(tmp_path / "docs")], "en", "ru")


def test_malformed_times_are_counted_as_unknown(tmp_path):
    stats = pc.CorpusStats()
    doc = ('<d>\n<s id="1"><time id="T1S" value="00:00:0x"/><w>a</w></s>\n'
           '<s id="2"><time id="T2S" value="00:01:02,5"/><w>b</w><time id="T2E" value="01:00:00.250"/></s>\n</d>\n')
    sents = pc.read_opus_document(doc.encode(), "doc.xml", (), stats)
    assert sents["1"].start is None and sents["2"].start == 62.5 and sents["2"].end == 3600.25
    assert stats.counts["malformed <time> values (taken as unknown)"] == 1
    assert stats.examples["malformed <time> values (taken as unknown)"] == "doc.xml:2"


# -------------------------------------------------------------- filter, split

def make_docs(lengths, prefix="d"):
    return [(f"{prefix}{i}", [(f"s{i}.{j}", f"t{i}.{j}") for j in range(n)])
            for i, n in enumerate(lengths)]


def test_filter_documents():
    stats = pc.CorpusStats()
    kept = pc.filter_documents(make_docs([6, 5, 7, 1]), 6, stats)
    assert [d for d, _ in kept] == ["d0", "d2"]
    assert stats.counts["documents dropped: fewer than 6 sentences"] == 2
    assert stats.counts["sentences dropped with them"] == 6


def test_split_documents_whole_groups_and_deterministic():
    docs = make_docs([3] * 20)
    groups = {d: f"movie{i // 4}" for i, (d, _) in enumerate(docs)}  # 5 movies, 4 docs each
    stats = pc.CorpusStats()
    a = pc.split_documents(docs, [("valid", 7), ("test", 6)], seed=3, groups=groups, stats=stats)
    assert pc.split_documents(docs, [("valid", 7), ("test", 6)], seed=3, groups=groups) == a
    assert pc.split_documents(docs, [("valid", 7), ("test", 6)], seed=4, groups=groups) != a
    sizes = {k: sum(len(p) for _, p in v) for k, v in a.items()}
    assert sizes["valid"] == 6 and sizes["test"] == 6  # whole documents, within the size
    movies = {k: {groups[d] for d, _ in v} for k, v in a.items()}
    assert len(movies["valid"]) == 1 and len(movies["test"]) == 1
    assert not (movies["train"] & (movies["valid"] | movies["test"]))
    assert sizes["train"] == 3 * 4 * 3  # the two held-out movies' other documents are discarded
    assert stats.counts["documents discarded (rest of a held-out group)"] == 4
    # corpus order inside each split
    for v in a.values():
        idx = [int(d[1:]) for d, _ in v]
        assert idx == sorted(idx)


def test_split_skips_a_document_longer_than_the_split():
    docs = make_docs([5, 1, 1, 1, 1, 1, 1])
    groups = {d: ("g" if i < 2 else f"h{i}") for i, (d, _) in enumerate(docs)}
    for seed in range(10):
        s = pc.split_documents(docs, [("valid", 1), ("test", 1)], seed=seed, groups=groups)
        assert [sum(len(p) for _, p in s[k]) for k in ("valid", "test")] == [1, 1]
        held = {d for k in ("valid", "test") for d, _ in s[k]}
        assert "d0" not in held  # five sentences never fit a one-sentence split
        if "d1" in held:  # group g was drawn: d0 was skipped and is not in train either
            assert "d0" not in {d for d, _ in s["train"]}


def test_split_errors():
    with pytest.raises(PrepDocsError, match="no document fits"):
        pc.split_documents(make_docs([5, 5]), [("valid", 2), ("test", 2)], seed=1)
    with pytest.raises(PrepDocsError, match="no document left for train"):
        pc.split_documents(make_docs([1, 1]), [("valid", 1), ("test", 1)], seed=1)


# ------------------------------------------------------------------ CLI, writing

def test_cli_opus_split_and_summary(tmp_path, capsys):
    opus_fixture(tmp_path)
    movies = ["1999/123", "2001/9", "2002/5"]
    for m in movies[1:]:  # the same subtitles as two more movies
        for lang, name in (("en", "42.xml.gz"), ("ru", "77.xml")):
            src = tmp_path / "docs" / lang / "1999" / "123" / name
            dst = tmp_path / "docs" / lang / m / name
            os.makedirs(dst.parent, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    links = [("1;1", 0.98), ("2;2", 0.95), ("3;3", 0.97), ("4;4", 0.99)]  # runs [1, 2], [3, 4]
    groups = [(f"en/{m}/42.xml.gz", f"ru/{m}/77.xml.gz", links) for m in movies]
    groups.append((f"en/{movies[2]}/42.xml.gz", f"ru/{movies[2]}/77.xml.gz", links[:1]))
    ali = write(tmp_path / "all.xml", alignment(groups))
    out = tmp_path / "out"
    rc = pc.main(["opus", "--alignment", ali, "--docs", str(tmp_path / "docs"), "--src-lang", "en",
                  "--tgt-lang", "ru", "--min-overlap", "0.9", "--max-gap", "7", "--out-dir",
                  str(out), "--valid-sentences", "2", "--test-sentences", "2", "--seed", "1",
                  "--summary", str(tmp_path / "s.json")])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "s.json").read_text())
    n = {k: len(lines(out / f"{k}.en")) for k in ("train", "valid", "test")}
    assert {k: v["sentences"] for k, v in summary["splits"].items()} == n
    assert n["valid"] == n["test"] == 2 and n["train"] in (4, 5)
    for k in n:
        assert len(lines(out / f"{k}.ru")) == len(lines(out / f"{k}.docids")) == n[k]
    assert sorted(os.listdir(out)) == sorted(f"{k}.{e}" for k in n for e in ("en", "ru", "docids"))
    ids = {k: lines(out / f"{k}.docids") for k in n}
    movie_of = lambda d: d.rsplit("/", 1)[0]  # noqa: E731
    held = {movie_of(d) for d in ids["valid"] + ids["test"]}
    assert len(held) == 2 and not held & {movie_of(d) for d in ids["train"]}
    everything = ids["train"] + ids["valid"] + ids["test"]
    if n["train"] == 5:  # the third movie in train: its second alignment is a document apart
        assert "2002/5/42~1.r0000" in everything
    discarded = summary["counts"]["documents discarded (rest of a held-out group)"]
    assert discarded == (2 if n["train"] == 5 else 3)
    printed = capsys.readouterr().out
    assert "ctx-prep-corpora: train" in printed and "pairs kept" in printed


def test_cli_errors_exit_2_and_write_nothing(tmp_path, capsys):
    s = write(tmp_path / "a.en", "<d>\na\n")
    t = write(tmp_path / "a.de", "<d>\na\nb\n")
    rc = pc.main(["doc-delimited", "--src", s, "--tgt", t, "--src-lang", "en", "--tgt-lang", "de",
                  "--out-prefix", str(tmp_path / "o" / "train")])
    assert rc == 2
    assert f"ctx-prep-corpora: error: {s}:1: document 1 has 1 sentences" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    rc = pc.main(["doc-delimited", "--src", s, "--tgt", s, "--src-lang", "en", "--tgt-lang", "de"])
    assert rc == 2 and "expected exactly one of them" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        pc.cli_main(["doc-delimited", "--src", s, "--tgt", t, "--src-lang", "en", "--tgt-lang",
                     "de", "--out-prefix", str(tmp_path / "o" / "x")])
    assert e.value.code == 2


def test_cli_min_doc_sentences(tmp_path):
    s = write(tmp_path / "a.en", "<d>\na\nb\n<d>\nc\n")
    t = write(tmp_path / "a.de", "<d>\nA\nB\n<d>\nC\n")
    assert pc.main(["doc-delimited", "--src", s, "--tgt", t, "--src-lang", "en", "--tgt-lang",
                    "de", "--out-prefix", str(tmp_path / "o" / "train"),
                    "--min-doc-sentences", "2"]) == 0
    assert lines(tmp_path / "o" / "train.docids") == ["doc00000", "doc00000"]


def test_postprocess_generate(tmp_path):
    gen = write(tmp_path / "gen.txt",
                "S-1\tsome source\nT-1\tthe ref\nH-1\t-0.5\tthe house , isn 't it ?\n"
                "D-1\t-0.5\tthe house , isn 't it ?\nP-1\t-0.1 -0.2\n"
                "S-0\tx\nH-0\t-0.1\t\" quoted \" .\nD-0\t-0.1\told\n"
                "H-2\t-0.3\tat &amp; t , 3 &lt; 4 .\n")
    n = pc.postprocess_generate(gen, str(tmp_path / "out.txt"), "en", detruecase=True)
    assert n == 3
    out = lines(tmp_path / "out.txt")
    assert "D-2\t-0.3\tAt &amp; t, 3 &lt; 4." in out  # nothing unescaped
    assert "D-1\t-0.5\tThe house, isn't it?" in out
    assert "D-0\t-0.1\t\"Quoted\"." in out
    assert sum(x.startswith("D-") for x in out) == 3 and "H-1\t-0.5\tthe house , isn 't it ?" in out
    bad = write(tmp_path / "bad.txt", "H-0\t-0.1\tthe hou@@ se\n")
    with pytest.raises(PrepDocsError, match=r"bad\.txt:1: hypothesis still holds BPE markers"):
        pc.postprocess_generate(bad, str(tmp_path / "o2.txt"), "en")


def test_moses_round_trip_keeps_xml_entities(tmp_path):
    """The recipes' tokenizer (moses_tok in recipes/lib/recipe.sh: no escaping,
    entities kept whole) and detokenizer (moses_detokenize: no unescaping) give
    back "&amp;" / "&lt;" in the text as they were; sacremoses' default
    unescaping would turn them into "&" / "<"."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = ["Tom &amp; Jerry say 3 &lt; 4 &gt; 2 .", "R&amp;D costs &quot;more&quot; &#124; AT&T's",
            "Fish & chips < 5 ."]
    src = write(tmp_path / "in.en", "\n".join(text) + "\n")
    out = tmp_path / "tok.en"
    r = subprocess.run(["bash", "-c", f'. "{repo}/recipes/lib/recipe.sh"; moses_tok en "$1" "$2"',
                        "x", src, str(out)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=sys.executable))
    assert r.returncode == 0, r.stderr
    tok = lines(out)
    assert tok[0] == "Tom &amp; Jerry say 3 &lt; 4 &gt; 2 ."
    assert tok[1] == "R&amp;D costs &quot;more&quot; &#124; AT & T 's"
    assert tok[2] == "Fish & chips < 5 ."
    assert [pc.moses_detokenize(t, "en") for t in tok] == \
        ["Tom &amp; Jerry say 3 &lt; 4 &gt; 2.", "R&amp;D costs &quot;more&quot; &#124; AT & T's",
         "Fish & chips < 5."]
    assert pc.moses_detokenize("tom &amp; jerry .", "en", detruecase=True) == "Tom &amp; jerry."
    from sacremoses import MosesDetokenizer

    assert MosesDetokenizer("en").detokenize(tok[0].split()) == "Tom & Jerry say 3 < 4 > 2."


def test_bpe_voita_suite(tmp_path):
    suite = write(tmp_path / "in" / "deixis_test.json", json.dumps([
        {"src": "you said it _eos did you ?", "dst": ["ты сказал _eos да ?", "вы сказали _eos да ?"],
         "true_ind": 1, "ctx_dist": 1}], ensure_ascii=False))
    src_codes = write(tmp_path / "codes.en", "#version: 0.2\ny o\nyo u</w>\n")
    tgt_codes = write(tmp_path / "codes.ru", "#version: 0.2\nс к\n")
    out = str(tmp_path / "out" / "deixis_test.json")
    assert pc.main(["bpe-voita-suite", suite, "--out-dir", str(tmp_path / "out"), "--src-codes",
                    src_codes, "--tgt-codes", tgt_codes]) == 0
    rec = json.loads(open(out, encoding="utf-8").read())[0]
    assert rec["src"] == "you s@@ a@@ i@@ d i@@ t _eos d@@ i@@ d you ?"
    assert rec["dst"][0].split(" _eos ")[1] == "д@@ а ?"
    assert rec["dst"][0].startswith("т@@ ы ск@@ ")
    assert rec["true_ind"] == 1 and rec["ctx_dist"] == 1
    bad = write(tmp_path / "bad.json", '[{"src": "a"}]')
    with pytest.raises(PrepDocsError, match="record 0: expected an object with 'src' and a 'dst'"):
        pc.bpe_voita_suite(bad, out, src_codes, tgt_codes)
    bad = write(tmp_path / "bad2.json", '[{"src": "a",\n')
    with pytest.raises(PrepDocsError, match=r"bad2\.json:2: not JSON"):
        pc.bpe_voita_suite(bad, out, src_codes, tgt_codes)
