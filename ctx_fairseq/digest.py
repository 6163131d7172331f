"""Content digests shared by the layers: the runtime data (``data/``, the
memory collater's cache keys) and the models (``modules/sentence_cache``,
the frozen memory's cache) key a sentence by the same digest, and neither
layer imports the other for it."""

import hashlib
from typing import Tuple

import numpy as np


def sentence_digest(tokens) -> Tuple[int, int]:
    """A 128-bit content digest (BLAKE2b) of a sentence's tokens (any
    integer sequence; compared as int64), as two signed 64-bit integers."""
    raw = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64)).tobytes()
    d = hashlib.blake2b(raw, digest_size=16).digest()
    return (int.from_bytes(d[:8], "little", signed=True),
            int.from_bytes(d[8:], "little", signed=True))
