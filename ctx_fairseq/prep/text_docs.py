"""Plain-text readers of ``ctx-prep-docs``: sentence-aligned files with a
``.docids`` file, with blank lines between documents, and IWSLT
``train.tags`` files (``<talkid>``/``<doc docid>`` lines between talks)."""

import re
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.data.docids import read_docid_lines as read_docids
from ctx_fairseq.prep.common import WHITESPACE, ParallelDoc, clean_text, read_text_lines
from ctx_fairseq.data.docids import DocFileError as PrepDocsError, check_docid, read_lines

# --------------------------------------------------------------------------
# plain text


def _check_counts(files: Sequence[Tuple[str, List[str]]]) -> None:
    """All files must have as many lines as the first one."""
    ref_path, ref = files[0]
    for path, lines in files[1:]:
        if len(lines) != len(ref):
            short_path, short, long_path, long = (
                (path, lines, ref_path, ref) if len(lines) < len(ref) else (ref_path, ref, path, lines))
            raise PrepDocsError(short_path, max(len(short), 1),
                                f"file ends after {len(short)} lines; expected {len(long)} lines "
                                f"as in {long_path} (line {len(short) + 1} there has no counterpart)")


def load_docids(src: str, tgt: str, docids: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int]:
    """Read sentence-aligned ``src``/``tgt`` plus the document id of each line."""
    ids = read_docids(docids)
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    _check_counts([(docids, ids), (src, src_lines), (tgt, tgt_lines)])
    docs: List[ParallelDoc] = []
    replaced = 0
    for lineno, (docid, s, t) in enumerate(zip(ids, src_lines, tgt_lines), 1):
        if not allow_empty:
            for path, text in ((src, s), (tgt, t)):
                if not text.strip():
                    raise PrepDocsError(path, lineno, f"empty line in document {docid}; expected a "
                                        "sentence (--allow-empty keeps it as an empty line)")
        s, n1 = clean_text(s)
        t, n2 = clean_text(t)
        replaced += n1 + n2
        if not docs or docs[-1][0] != docid:
            docs.append((docid, []))
        docs[-1][1].append((s, t))
    return docs, replaced


def load_blank_lines(src: str, tgt: str, doc_prefix: str = "doc") -> Tuple[List[ParallelDoc], int]:
    """Read sentence-aligned ``src``/``tgt`` with a blank (or whitespace-only)
    line between documents, at the same positions in both files. Blank lines
    before the first and after the last document are ignored; two blank lines
    in a row would make an empty document and are an error. Documents get the
    ids ``{doc_prefix}00000``, ``{doc_prefix}00001``, ..."""
    if WHITESPACE.search(doc_prefix):
        raise PrepDocsError("--doc-prefix", None, f"{doc_prefix!r} contains whitespace; "
                                                  "expected one token, e.g. ted.")
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    _check_counts([(src, src_lines), (tgt, tgt_lines)])
    docs: List[ParallelDoc] = []
    replaced = 0
    cur: Optional[List[Tuple[str, str]]] = None
    blank_since: Optional[int] = None  # first line of the current run of blank lines
    for lineno, (s, t) in enumerate(zip(src_lines, tgt_lines), 1):
        s_blank, t_blank = not s.strip(), not t.strip()
        if s_blank != t_blank:
            if t_blank:
                raise PrepDocsError(tgt, lineno, f"blank line (document break) where {src}:{lineno} "
                                    "has a sentence; expected blank lines at the same positions")
            raise PrepDocsError(tgt, lineno, f"sentence where {src}:{lineno} is a blank line "
                                "(document break); expected blank lines at the same positions")
        if s_blank:
            if blank_since is not None and docs:
                raise PrepDocsError(src, lineno, f"second blank line in a row (from line {blank_since}) "
                                    "makes an empty document; expected exactly one blank line "
                                    "between documents")
            if blank_since is None:
                blank_since = lineno
            cur = None
            continue
        blank_since = None
        if cur is None:
            cur = []
            docs.append((f"{doc_prefix}{len(docs):05d}", cur))
        s, n1 = clean_text(s)
        t, n2 = clean_text(t)
        replaced += n1 + n2
        cur.append((s, t))
    if not docs:
        raise PrepDocsError(src, 1, "no sentences; expected documents separated by blank lines")
    return docs, replaced


# --------------------------------------------------------------------------
# IWSLT train.tags files

_TAG_TALKID = re.compile(r"<talkid>(.*?)</talkid>", re.I)
_TAG_DOCID = re.compile(r"""<doc\s[^>]*\bdocid\s*=\s*["']([^"']*)["']""", re.I)


def _is_tag_line(line: str) -> bool:
    """A metadata line of a ``train.tags`` file: its first non-blank character
    is ``<`` (the IWSLT README: transcripts are the lines not starting with it)."""
    return line.lstrip().startswith("<")


def _tag_talk_ids(path: str, lines: List[str], start: int, end: int) -> List[Tuple[str, int]]:
    """The talk ids named in the metadata lines ``start..end-1`` (0-based) with
    their 1-based line numbers: the ``<talkid>N</talkid>`` values, or for a
    run without any ``<talkid>``, the ``<doc docid="N">`` values."""
    found = {"talkid": [], "docid": []}  # type: Dict[str, List[Tuple[str, int]]]
    for i in range(start, end):
        for key, pattern in (("talkid", _TAG_TALKID), ("docid", _TAG_DOCID)):
            m = pattern.search(lines[i])
            if m is not None:
                found[key].append((m.group(1).strip(), i + 1))
    ids = found["talkid"] or found["docid"]
    for talkid, line in ids:
        check_docid(talkid, path, line, "talk id")
    return ids


def load_tags(src: str, tgt: str, allow_empty: bool = False,
              universal_newlines: bool = True) -> Tuple[List[ParallelDoc], int, List[str]]:
    """Read a pair of IWSLT ``train.tags.L1-L2.{L1,L2}`` files.

    Lines whose first non-blank character is ``<`` are metadata (``<url>``,
    ``<keywords>``, ``<speaker>``, ``<talkid>``, ``<title>``,
    ``<description>``, ``<reviewer>``, ``<translator>``; also ``<doc ...>``
    and ``</doc>`` where a file has them); the other lines are the
    transcript, one segment per line, line-aligned between the files. Each
    run of metadata lines that is followed by transcript lines starts a talk,
    whose id is the run's ``<talkid>`` (or, without one, its
    ``<doc docid=...>``); title and description are metadata, not text.

    Checked: equal line counts, metadata lines at the same lines in both
    files with the same talk ids, one id per talk, unique ids, no transcript
    line before the first talk's metadata, no empty transcript line (unless
    ``allow_empty``). A run naming several talks holds talks without any
    transcript line: they are skipped and their ids returned (the summary
    line counts them); metadata after the last transcript line (``</doc>``)
    is ignored. Returns (documents, line breaks replaced, skipped talk ids).

    Lines end where Python's universal newlines end them (``\\n``, ``\\r\\n``,
    ``\\r``, as fairseq-preprocess reads), or with ``universal_newlines=False``
    at ``\\n`` only (:func:`~ctx_fairseq.prep.common.read_text_lines`: a stray
    ``\\r`` inside a line is then a line break inside the segment, replaced by
    a space like any other; the sentence-level recipes' reading)."""
    read = read_lines if universal_newlines else read_text_lines
    src_lines, tgt_lines = read(src), read(tgt)
    _check_counts([(src, src_lines), (tgt, tgt_lines)])
    n = len(src_lines)
    if n == 0:
        raise PrepDocsError(src, 1, "empty file; expected talks (metadata lines, then transcript lines)")
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines)):
        s_tag, t_tag = _is_tag_line(s), _is_tag_line(t)
        if s_tag != t_tag:
            if s_tag:
                raise PrepDocsError(tgt, i + 1, f"transcript line where {src}:{i + 1} is a metadata "
                                    "line (starts with '<'); expected metadata at the same lines")
            raise PrepDocsError(tgt, i + 1, f"metadata line (starts with '<') where {src}:{i + 1} "
                                "is a transcript line; expected metadata at the same lines")
    docs: List[ParallelDoc] = []
    skipped: List[str] = []
    first_line: Dict[str, int] = {}
    replaced = 0
    i = 0
    while i < n:
        if not _is_tag_line(src_lines[i]):
            raise PrepDocsError(src, i + 1, "transcript line before any talk metadata; expected "
                                "each talk to start with its metadata lines (<url>, <talkid>, ...)")
        start = i
        while i < n and _is_tag_line(src_lines[i]):
            i += 1
        end = i  # metadata lines start..end-1, transcript from end
        s_ids = _tag_talk_ids(src, src_lines, start, end)
        t_ids = _tag_talk_ids(tgt, tgt_lines, start, end)
        if [x for x, _ in s_ids] != [x for x, _ in t_ids]:
            raise PrepDocsError(tgt, (t_ids[0][1] if t_ids else start + 1),
                                f"talk id(s) {', '.join(x for x, _ in t_ids) or 'none'} in the "
                                f"metadata of lines {start + 1}-{end}; expected "
                                f"{', '.join(x for x, _ in s_ids) or 'none'} as in {src}")
        for talkid, line in s_ids:
            if talkid in first_line:
                raise PrepDocsError(src, line, f"duplicate talk id {talkid} (first at line "
                                    f"{first_line[talkid]}); expected unique talk ids")
            first_line[talkid] = line
        if i == n:
            # metadata after the last transcript line: closing tags (</doc>) or
            # talks without text
            skipped.extend(x for x, _ in s_ids)
            break
        if not s_ids:
            raise PrepDocsError(src, start + 1, f"the metadata of lines {start + 1}-{end} names no "
                                "talk (no <talkid>N</talkid> or <doc docid=\"N\">); expected each "
                                "talk's id before its transcript")
        skipped.extend(x for x, _ in s_ids[:-1])
        talkid = s_ids[-1][0]
        pairs: List[Tuple[str, str]] = []
        while i < n and not _is_tag_line(src_lines[i]):
            s, n1 = clean_text(src_lines[i].strip())
            t, n2 = clean_text(tgt_lines[i].strip())
            replaced += n1 + n2
            if not allow_empty and (not s or not t):
                raise PrepDocsError(src if not s else tgt, i + 1, f"talk {talkid}: empty "
                                    "transcript line; expected text (--allow-empty keeps it as "
                                    "an empty line)")
            pairs.append((s, t))
            i += 1
        docs.append((talkid, pairs))
    if not docs:
        raise PrepDocsError(src, 1, "no transcript lines; expected talks (metadata lines, then "
                                    "transcript lines)")
    return docs, replaced, skipped


