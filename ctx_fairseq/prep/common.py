"""What the corpus readers share: a document's type (its id and sentence
pairs), the summary of a preparation, and the cleaning of line breaks inside
sentences; the input error and the ``.docids`` reader are the runtime
data's (:mod:`ctx_fairseq.data.docids`)."""

import re
from typing import List, NamedTuple, Optional, Tuple

from ctx_fairseq.data.docids import DocFileError as PrepDocsError  # noqa: F401
from ctx_fairseq.data.docids import check_docid, read_lines  # noqa: F401

# One document: its id and its sentence pairs (source, target).
ParallelDoc = Tuple[str, List[Tuple[str, str]]]

# Characters that str.splitlines() (and so some readers of our output) treat
# as line boundaries. A sentence must never contain one, or the three output
# files would stop being line-aligned for such readers.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
LINE_BREAK_RUN = re.compile("[ \t]*[" + _LINE_BREAKS + "]+[ \t]*")
WHITESPACE = re.compile(r"\s")


class PrepSummary(NamedTuple):
    documents: int
    sentences: int
    files: Tuple[str, str, str]  # source, target, docids
    line_breaks_replaced: int  # line breaks inside sentences turned into spaces
    hyp_file: Optional[str] = None  # wmt --hyp-system: PREFIX.hyp.L2
    note: str = ""  # wmt: which references were used, what was skipped


def clean_text(text: str) -> Tuple[str, int]:
    """Replace each run of line-break characters (and the blanks around it)
    inside ``text`` by one space; returns the text and the number of runs."""
    return LINE_BREAK_RUN.subn(" ", text)


