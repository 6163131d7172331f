"""One switch for the CPU's shortcuts, so that the path an accelerator runs
can run, and be tested, on the CPU.

On the CPU a few modules save work by reading values back to the host,
which costs little there and would stall a GPU (a host read waits for
every queued kernel). Each asks :func:`cpu_shortcuts` whether to take its
shortcut:

* :class:`ctx_fairseq.modules.sparsemax._Sparsemax`: the threshold sought
  among the largest ``TOP`` entries first (a partial sort; one read per call
  to see whether it sufficed);
* :func:`ctx_fairseq.modules.word_attention.streamed_word_attention`:
  compacted tiles (a tile computes only its query rows with weight; a read
  per tile) and the CPU's block and tile sizes
  (:func:`~ctx_fairseq.modules.word_attention.word_block_for`,
  :func:`~ctx_fairseq.modules.word_attention.tile_elems_for`); off it, the
  hierarchical word level computes the selected sentences only, as on an
  accelerator (:mod:`ctx_fairseq.modules.selected_word_attention`);
* :class:`ctx_fairseq.modules.real_token_ffn.RealTokenEncoderLayer` /
  ``RealTokenDecoderLayer``: the FFN on the real tokens (a read of their
  positions).

Each result is the same either way up to rounding (tested in float64:
``tests/test_selective_accelerator.py``). :func:`accelerator_path` turns the
shortcuts off within a ``with`` block (tests, ``ctx-bench --trace``); on
any device but the CPU they are always off.
"""

import contextlib
from typing import Iterator, Union

import torch

__all__ = ["cpu_shortcuts", "accelerator_path"]

_OFF = [0]  # nesting depth of accelerator_path()


def cpu_shortcuts(device: Union[torch.device, str]) -> bool:
    """True where the CPU's shortcuts apply: ``device`` is the CPU and no
    :func:`accelerator_path` block is active."""
    return torch.device(device).type == "cpu" and _OFF[0] == 0


@contextlib.contextmanager
def accelerator_path() -> Iterator[None]:
    """Within the block, every module takes the accelerator's path on the
    CPU too (the shortcuts off); blocks nest."""
    _OFF[0] += 1
    try:
        yield
    finally:
        _OFF[0] -= 1
