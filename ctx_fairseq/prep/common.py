"""What the corpus readers share: a document's type (its id and sentence
pairs), the summary of a preparation, the counts of what a reader dropped
(:class:`CorpusStats`), the lines of a UTF-8 text file split at ``\\n`` only
(:func:`read_text_lines`), and the cleaning of line breaks and white space
inside sentences; the input error and the ``.docids`` reader are the
runtime data's (:mod:`ctx_fairseq.data.docids`)."""

import collections
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

from ctx_fairseq.data.docids import DocFileError as PrepDocsError

# One document: its id and its sentence pairs (source, target).
ParallelDoc = Tuple[str, List[Tuple[str, str]]]

# Characters that str.splitlines() (and so some readers of our output) treat
# as line boundaries. A sentence must never contain one, or the three output
# files would stop being line-aligned for such readers.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
LINE_BREAK_RUN = re.compile("[ \t]*[" + _LINE_BREAKS + "]+[ \t]*")
WHITESPACE = re.compile(r"\s")
SPACE_RUN = re.compile(r"\s+")


class PrepSummary(NamedTuple):
    documents: int
    sentences: int
    files: Tuple[str, str, str]  # source, target, docids
    line_breaks_replaced: int  # line breaks inside sentences turned into spaces
    hyp_file: Optional[str] = None  # wmt --hyp-system: PREFIX.hyp.L2
    note: str = ""  # wmt: which references were used, what was skipped


def read_text_lines(path: str) -> List[str]:
    """Lines of a UTF-8 file split at ``\\n`` only (so that line numbers are
    those an editor shows); a trailing ``\\r`` is dropped, a byte-order mark too."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None
    return decode_text_lines(path, raw)


def decode_text_lines(path: str, raw: bytes) -> List[str]:
    """The lines of ``raw``, a UTF-8 file's bytes (``path`` names it in
    errors), as :func:`read_text_lines` splits them."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise PrepDocsError(path, line, f"not UTF-8 ({err.reason} at byte {err.start}); "
                                        "expected a UTF-8 file") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [x[:-1] if x.endswith("\r") else x for x in lines]


def clean_text(text: str) -> Tuple[str, int]:
    """Replace each run of line-break characters (and the blanks around it)
    inside ``text`` by one space; returns the text and the number of runs."""
    return LINE_BREAK_RUN.subn(" ", text)


class CorpusStats:
    """Counts of what a reader kept and dropped, and why; notes for the summary."""

    def __init__(self):
        self.counts: "collections.Counter[str]" = collections.Counter()
        self.examples: Dict[str, str] = {}  # reason -> first FILE:LINE

    def add(self, key: str, n: int = 1, where: Optional[str] = None) -> None:
        self.counts[key] += n
        if where is not None and key not in self.examples:
            self.examples[key] = where

    def to_dict(self) -> Dict:
        return {"counts": dict(sorted(self.counts.items())), "first_examples": dict(self.examples)}

    def lines(self) -> List[str]:
        out = []
        for key, n in sorted(self.counts.items()):
            ex = f" (first: {self.examples[key]})" if key in self.examples else ""
            out.append(f"  {key}: {n}{ex}")
        return out


def collapse_whitespace(text: str) -> str:
    """Surrounding white space stripped, every run of white space (line breaks
    included) one space: one line per sentence whatever the input held."""
    return SPACE_RUN.sub(" ", text).strip()
