"""Helpers of the ctx-prep-docs tests (tests/test_prep_docs*.py): the shared
IWSLT17 copy, reading and writing files, running the command line and
checking its one-line errors."""

import html
import os
import re

import pytest

from ctx_fairseq.prep import docs as pd
from fairseq_cli_utils import REPO_ROOT, run_main

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


def run_ok(argv, capsys):
    """Run ctx-prep-docs where it is to succeed: checks the exit status (0,
    else the assertion shows stderr); returns stdout."""
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    return out


def out_files(out_dir):
    return sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []


def fail_nth_fdopen(monkeypatch, n):
    """Make the ``n``-th ``os.fdopen`` fail as a full disk does (its file
    descriptor closed), to check that a failed write leaves nothing behind;
    returns the list of descriptors it was called with."""
    real = os.fdopen
    calls = []

    def failing_fdopen(fd, *a, **k):
        calls.append(fd)
        if len(calls) == n:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real(fd, *a, **k)

    monkeypatch.setattr(pd.os, "fdopen", failing_fdopen)
    return calls


def seg_in_iwslt(raw, seg):
    """``(offset, docid, line)`` of the first ``<seg id="SEG">`` of an IWSLT
    XML file's text ``raw``: where a test corrupts it, and what the error names."""
    pos = raw.index(f'<seg id="{seg}">')
    docid = re.findall(r'<doc\s[^>]*docid="([^"]*)"', raw[:pos])[-1]
    return pos, docid, raw[:pos].count("\n") + 1


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
