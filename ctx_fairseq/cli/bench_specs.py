"""ctx-bench's architecture specifications (``ARCH[--option value ...]``,
comma-separated) and what it reads of a document batch; shared by the
timed bench (:mod:`ctx_fairseq.cli.bench`) and ``--trace``
(:mod:`ctx_fairseq.cli.bench_trace`)."""

import re
import shlex
from typing import List, Optional, Tuple

import torch

__all__ = ["split_specs", "parse_spec", "memory_sentences", "train_batches"]


def split_specs(text: str) -> List[str]:
    """Split ``a,b[--x 1,2],c`` at commas outside brackets."""
    specs, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"--archs: unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            specs.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"--archs: unbalanced '[' in {text!r}")
    specs.append(cur.strip())
    return [s for s in specs if s]


def parse_spec(spec: str) -> Tuple[str, List[str]]:
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[(.*)\])?", spec.strip())
    if not m:
        raise ValueError(f"--archs: cannot parse {spec!r}; expected ARCH or ARCH[--option value ...]")
    return m.group(1), shlex.split(m.group(2) or "")


def memory_sentences(sample) -> Optional[int]:
    """Sentences of a batch's document memory (``mem_src_tokens`` rows), None
    for a model without one."""
    mem = sample["net_input"].get("mem_src_tokens")
    return int(mem.size(0)) if torch.is_tensor(mem) else None


def train_batches(task, ds, margs, max_tokens: int, seed: int, max_positions=None) -> List:
    """The non-empty batches (index arrays) the task's own iterator forms over
    ``ds`` with fairseq-train's arguments (``margs``: the model's namespace,
    its batch size, multiple and seed), as ctx-bench measures them."""
    import numpy as np

    itr = task.get_batch_iterator(
        ds, max_tokens=max_tokens, max_sentences=getattr(margs, "batch_size", None),
        max_positions=max_positions, ignore_invalid_inputs=False,
        required_batch_size_multiple=getattr(margs, "required_batch_size_multiple", 1),
        seed=getattr(margs, "seed", seed), epoch=1, disable_iterator_cache=True)
    return [np.asarray(b, dtype=np.int64) for b in itr.frozen_batches if len(b)]
