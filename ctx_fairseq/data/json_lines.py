"""JSON Lines files read one way by every reader of the plugin's record files
(the toy corpus's contrastive set, the contrastive suites, ctx-dp-suite's
suites): blank lines skipped, and a line that is not JSON named by its file
and line number in the error the reader raises, so that each reader checks
only its own records' fields."""

import json
from typing import Iterable, Iterator, Tuple, Type

__all__ = ["json_lines"]


def json_lines(path: str, lines: Iterable[str], error: Type[Exception] = ValueError
               ) -> Iterator[Tuple[int, object]]:
    """``(line number, value)`` of every non-blank line of ``lines`` (the text
    of ``path``, numbered from 1); a line that is not JSON raises
    ``error("PATH:N: not valid JSON (why)")``."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
        yield lineno, value
