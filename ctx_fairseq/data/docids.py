"""Document ids: the ``{split}.docids`` file beside the binarized data (one id
per sentence, each document's sentences contiguous), read the same way by
the runtime dataset (:func:`read_docids`, checked against the number of
sentences) and by corpus preparation (``ctx_fairseq.prep.docs``, which
writes them: :func:`read_docid_lines`, :func:`check_docid`,
:func:`read_lines`). The ground floor: imports only ``ctx_fairseq.errors``."""

import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from ctx_fairseq.errors import InputError

__all__ = ["DocFileError", "DocumentIdError", "check_docid", "check_docids", "read_docid_lines",
           "read_docids", "read_lines"]

_WHITESPACE = re.compile(r"\s")


class DocFileError(InputError):
    """An input problem in a file: ``path``, 1-based ``line`` (or None) and
    ``message`` (``ctx_fairseq.prep.docs.PrepDocsError`` is this class)."""

    def __init__(self, path: str, line: Optional[int], message: str):
        self.path = path
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}:{self.line}: {self.message}"


def check_docid(docid: str, path: str, line: int, what: str = "document id") -> None:
    """A document id is one non-empty token."""
    if not docid:
        raise DocFileError(path, line, f"empty {what}; expected a non-empty id")
    if _WHITESPACE.search(docid):
        raise DocFileError(path, line, f"{what} {docid!r} contains whitespace; "
                                        "expected one token (the .docids file has one id per line)")


def read_lines(path: str) -> List[str]:
    """Lines without their line endings. Line endings are those of Python's
    universal-newline mode (``\\n``, ``\\r\\n``, ``\\r``), as fairseq-preprocess
    reads them; a UTF-8 byte-order mark is dropped."""
    try:
        with open(path, encoding="utf-8-sig", newline=None) as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]
    except UnicodeDecodeError as err:
        raise DocFileError(path, None, f"not UTF-8 ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DocFileError(path, None, f"cannot read: {err.strerror or err}") from None


def read_docid_lines(path: str) -> List[str]:
    """Read a document-id file (one id per line) and check it: no empty ids,
    no whitespace inside an id, and documents contiguous (an id that comes
    back after another document started is an error naming the line).
    Returns the id of each line."""
    ids = [x.strip() for x in read_lines(path)]
    if not ids:
        raise DocFileError(path, 1, "empty file; expected one document id per line")
    first: Dict[str, int] = {}
    last: Dict[str, int] = {}
    prev = None
    for lineno, docid in enumerate(ids, 1):
        check_docid(docid, path, lineno)
        if docid != prev and docid in first:
            raise DocFileError(path, lineno, f"document {docid} reappears: its lines "
                                f"{first[docid]}-{last[docid]} were followed by document {prev} "
                                f"(from line {first[prev]}); expected each document's lines "
                                "to be contiguous")
        first.setdefault(docid, lineno)
        last[docid] = lineno
        prev = docid
    return ids


class DocumentIdError(InputError):
    """Document ids that do not fit the data (count, empty id, non-contiguous)."""


def read_docids(path: str, expected: Optional[int] = None) -> List[str]:
    """Read ``{split}.docids`` (one id per line) with the reader of
    ``ctx-prep-docs`` (:func:`read_docid_lines`: UTF-8,
    a byte-order mark dropped, each id stripped of surrounding white space,
    no empty id, no white space inside an id, documents contiguous), then
    check it against the number of sentences ``expected``."""
    if not os.path.exists(path):
        raise DocumentIdError(
            f"{path}: document ids not found; the document-level task needs one document id "
            f"per sentence beside the binarized data ({{split}}.docids)")
    if expected == 0 and os.path.getsize(path) == 0:
        return []
    try:
        ids = read_docid_lines(path)
    except DocFileError as err:
        raise DocumentIdError(str(err)) from None
    check_docids(ids, path, expected)
    return ids


def check_docids(ids: Sequence[str], path: str = "<docids>", expected: Optional[int] = None) -> None:
    if expected is not None and len(ids) != expected:
        raise DocumentIdError(
            f"{path}: {len(ids)} document ids for {expected} sentences; expected exactly one "
            f"document id per sentence (line) of the data")
    for lineno, doc in enumerate(ids, 1):
        if not doc.strip():
            raise DocumentIdError(f"{path}:{lineno}: empty document id; expected one id per line")
    if not ids:
        return
    arr = np.asarray(ids, dtype=object)
    starts = np.flatnonzero(np.concatenate([[True], arr[1:] != arr[:-1]]))
    run_ids = arr[starts]
    _, first, counts = np.unique(run_ids.astype(str), return_index=True, return_counts=True)
    if (counts > 1).any():
        # the earliest run that repeats an earlier document
        seen = {}
        for r, (s, doc) in enumerate(zip(starts, run_ids)):
            if doc in seen:
                prev_start, prev_end = seen[doc]
                raise DocumentIdError(
                    f"{path}:{s + 1}: document {doc!r} reappears after another document "
                    f"(it was at lines {prev_start + 1}-{prev_end}); expected each document's "
                    f"sentences to be contiguous")
            end = starts[r + 1] if r + 1 < len(starts) else len(arr)
            seen[doc] = (s, end)
