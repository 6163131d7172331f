"""The sentence-count frame of doc2doc generation (issue 39, item 4): beam
search on a segment ``x_1 <sep> x_2 <sep> ... x_n </s>`` whose every
hypothesis is ``y_1 <sep> ... y_n </s>``, exactly ``n`` sentences, so that the
output splits back into one line per source sentence.

G-Transformer (Bao et al. 2021) keeps its output aligned sentence by sentence
at generation; the authors' generator (their fork of fairseq's
``sequence_generator.py``, ``force_length``) already bounds each sentence
between a minimum and ``max_len_a * |x_i| + max_len_b`` source-relative
tokens, the idea and the bounds used here. The implementation (no code of
theirs is used) and its budget rule for the model's positions are this
repository's: a constraint on the log-probabilities of every step (fairseq's
``SequenceGenerator`` unchanged; :class:`SentenceFrame` wraps its
``EnsembleModel`` for one call, as :class:`~ctx_fairseq.tasks.generation.ForcedPrefixes`
does). Notation, per hypothesis after ``t`` generated tokens: ``k`` the
separators emitted so far (the hypothesis is in sentence ``k``, 0-based),
``c`` the tokens of that sentence so far, ``r = n - 1 - k`` the separators
still to come, ``m`` ``--doc2doc-min-sentence-len``:

* per-sentence maximum: ``L_i = max(floor(a * |x_i| + b), m)`` (``a``, ``b``:
  ``--doc2doc-max-len-a``/``-b``; ``|x_i|`` the source sentence's tokens,
  separator and ``</s>`` excluded; raised to ``m`` so that a short source
  sentence never forbids its own end);
* ``<sep>`` allowed iff ``c >= m`` and ``r > 0``;
* ``</s>`` allowed iff ``c >= m`` and ``r == 0`` (only in the last sentence);
* any other token allowed iff ``c < L_k`` and the whole output still fits
  after it: ``t + 1 + max(m - c - 1, 0) + r (m + 1) <= T`` (the tokens the
  rest of the frame needs at least, after this one), where ``T`` is the
  batch's maximum output length (below).

``T = min(max_rows (sum_i L_i + n - 1), max target positions - 1)``: the
generator's own limit for the call (its ``--max-len-a/-b`` are replaced by
the frame's for the call). Where the model's positions cap it, the budget
rule above still lets every row finish its ``n`` sentences (a sentence then
ends before its ``L_i``; logged once); a row that cannot fit even ``n``
sentences of ``m`` tokens (``n (m + 1) - 1 > T``) is an error naming the
segment. Every state allows at least one token (a sentence at ``L_k`` has
``c >= m``, so its separator, or ``</s>`` in the last sentence, is allowed,
and the budget rule keeps ``t + max(m - c, 0) + r (m + 1) <= T`` true after
every allowed token), and fairseq's forced ``</s>`` at step ``T`` meets a hypothesis in its
last sentence with ``c >= m``: no hypothesis is left with only ``-inf``.

Static shapes and no read back per step: ``n`` and ``L`` are computed once
per call on the device from ``src_tokens`` (vectorised: the separators'
``cumsum`` gives each source token its sentence, a ``scatter_add`` the
lengths); ``k`` and ``c`` are kept per hypothesis and updated from the last
token of each step, reordered with the beams (``reorder_incremental_state``:
the generator's new order of the hypotheses, finished rows removed), as is
each hypothesis's batch row. The only read to the host during the search is
one per call, of two numbers (the batch's longest frame and shortest feasible
length), to set ``T`` before the search starts; after it, one more of two
numbers: how many sentences of the best hypotheses reached their ``L_i``,
and how many rows reached ``T`` where the positions capped it
(:meth:`SentenceFrame.at_maximum`; the task logs a warning with the counts
and the running totals, as for the cut segments of doc2doc without the frame).

Not combined with ``--prefix-size``, ``--constraints``, ``--match-source-len``,
``--min-len`` above 1 (the frame sets the lengths) or ``--no-repeat-ngram-size``
(it counts the separator as a word: after a first ``. <sep>`` it would forbid
the separator the frame needs after another ``.``): refused with an
:class:`~ctx_fairseq.errors.InputError`. fairseq's ``--max-len-a/-b`` are
replaced by the frame's for the call.
"""

import logging
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import torch

from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.generation import GeneratorCallWrapper

logger = logging.getLogger(__name__)
_capped_logged = []  # (the positions' cap is logged once per process)

__all__ = ["FrameOptions", "doc2doc_mode", "always_frames", "frame_options",
           "check_frame_generator", "SentenceFrame", "source_sentence_lengths"]


@dataclass(frozen=True)
class FrameOptions:
    """What the frame reads from the task options."""
    separator: str = "<sep>"
    min_sentence_len: int = 1
    max_len_a: float = 1.5
    max_len_b: int = 10


def doc2doc_mode(cfg) -> str:
    """``--doc2doc`` as a string (``none`` where the option is not declared)."""
    mode = getattr(cfg, "doc2doc", "none")
    return "none" if mode is None else str(getattr(mode, "value", mode))


def always_frames(model) -> bool:
    """Whether ``model`` always decodes with the frame: its class says so
    (``always_frame = True``), or it is ``transformer_gtrans`` (G-Transformer
    keeps its output aligned sentence by sentence; its group tags assume it)."""
    from fairseq.models import MODEL_REGISTRY

    gtrans = MODEL_REGISTRY.get("transformer_gtrans")
    return bool(getattr(model, "always_frame", False)) or (
        gtrans is not None and isinstance(model, gtrans))


def frame_options(cfg, models: Sequence = ()) -> Optional[FrameOptions]:
    """The frame's options when generation uses it, else None: with
    ``--doc2doc`` (greedy or multires), given ``--doc2doc-frame`` or a model
    that always decodes with it (a class attribute ``always_frame = True``:
    ``transformer_gtrans``). ``--doc2doc-frame`` without ``--doc2doc`` is an
    error (sentence-level batches have no separators to count)."""
    framed = bool(getattr(cfg, "doc2doc_frame", False))
    if doc2doc_mode(cfg) == "none":
        if framed:
            raise InputError("--doc2doc-frame constrains the sentences of a doc2doc segment: it "
                             "needs --doc2doc greedy or --doc2doc multires")
        return None
    if not (framed or any(always_frames(m) for m in models)):
        return None
    opts = FrameOptions(separator=str(getattr(cfg, "doc2doc_separator", "<sep>")),
                        min_sentence_len=int(getattr(cfg, "doc2doc_min_sentence_len", 1)),
                        max_len_a=float(getattr(cfg, "doc2doc_max_len_a", 1.5)),
                        max_len_b=int(getattr(cfg, "doc2doc_max_len_b", 10)))
    if opts.min_sentence_len < 1:
        raise InputError(f"--doc2doc-min-sentence-len {opts.min_sentence_len}: a sentence of "
                         "the frame needs at least 1 token")
    if opts.max_len_a < 0:
        raise InputError(f"--doc2doc-max-len-a {opts.max_len_a} must be >= 0")
    return opts


def check_frame_generator(args) -> None:
    """The generation options the frame cannot be combined with (it sets the
    lengths itself): one-line errors, before any batch is generated."""
    if getattr(args, "match_source_len", False):
        raise InputError("--match-source-len cannot be combined with the sentence-count frame "
                         "(it sets each sentence's maximum from --doc2doc-max-len-a/-b)")
    if int(getattr(args, "min_len", 1) or 1) > 1:
        raise InputError(f"--min-len {args.min_len} cannot be combined with the sentence-count "
                         "frame; set each sentence's minimum with --doc2doc-min-sentence-len")
    if int(getattr(args, "no_repeat_ngram_size", 0) or 0) > 0:
        raise InputError("--no-repeat-ngram-size cannot be combined with the sentence-count "
                         "frame: it counts the separators as words, so it forbids a separator "
                         "after the same words twice (e.g. '. <sep>') where the frame needs one")
    if int(getattr(args, "prefix_size", 0) or 0) > 0:
        raise InputError("--prefix-size cannot be combined with the sentence-count frame")
    if getattr(args, "constraints", None):
        raise InputError("--constraints cannot be combined with the sentence-count frame")


def source_sentence_lengths(src_tokens: torch.Tensor, sep: int, eos: int, pad: int):
    """``(n, lengths)``: per row, the number of sentences (separators + 1)
    and a ``B x S`` tensor of their lengths (separator, ``</s>`` and padding
    excluded; ``S = src_tokens.size(1)``, columns ``>= n`` zero). On the
    device of ``src_tokens``, no read back."""
    is_sep = src_tokens.eq(sep)
    sent = torch.cumsum(is_sep.long(), 1) - is_sep.long()  # the <sep> ending x_i is in i
    real = src_tokens.ne(pad) & src_tokens.ne(eos) & ~is_sep
    lengths = torch.zeros_like(src_tokens).scatter_add_(1, sent, real.long())
    return is_sep.sum(1) + 1, lengths


class SentenceFrame(GeneratorCallWrapper):
    """The frame for one call of fairseq's ``SequenceGenerator`` on a batch
    of segments (a context manager; see the module docstring)."""

    def __init__(self, generator, sample, src_sep: int, tgt_sep: int, opts: FrameOptions,
                 src_pad: Optional[int] = None, src_eos: Optional[int] = None,
                 describe: Optional[Callable[[int], str]] = None):
        self.gen = generator
        self.describe = describe  # segment id -> its document etc., for the error
        self.model = getattr(generator, "model", None)
        if self.model is None or not hasattr(self.model, "forward_decoder"):
            raise InputError(f"the sentence-count frame needs fairseq's SequenceGenerator (beam "
                             f"search or sampling); got {type(generator).__name__}")
        check_frame_generator(SimpleNamespace(
            match_source_len=getattr(generator, "match_source_len", False),
            min_len=generator.min_len,
            no_repeat_ngram_size=0 if getattr(generator, "repeat_ngram_blocker", None) is None
            else 1))
        src = sample["net_input"]["src_tokens"]
        self.eos, self.sep, self.m = generator.eos, tgt_sep, opts.min_sentence_len
        pad = generator.pad if src_pad is None else src_pad
        n, lengths = source_sentence_lengths(src, src_sep, generator.eos if src_eos is None
                                             else src_eos, pad)
        cap = torch.floor(lengths.double() * opts.max_len_a + opts.max_len_b).long()
        cap = cap.clamp(min=self.m)
        in_row = torch.arange(src.size(1), device=src.device).unsqueeze(0) < n.unsqueeze(1)
        total = (cap * in_row).sum(1) + n - 1
        fewest = n * (self.m + 1) - 1
        limit = generator.max_len - 1
        longest, hardest = torch.stack([total.max(), fewest.max()]).tolist()  # one read per call
        self.max_len = min(int(longest), limit)
        self.capped = longest > limit
        if hardest > self.max_len:
            self._refuse(sample, fewest, n, limit)
        if longest > limit and not _capped_logged:
            _capped_logged.append(True)
            logger.warning("sentence-count frame: the longest segment of a batch may need %d "
                           "target tokens (sum of --doc2doc-max-len-a * |x_i| + "
                           "--doc2doc-max-len-b, and its separators); the model's maximum "
                           "target positions cap it at %d (its sentences may end before their "
                           "own maximum)", longest, limit)
        self.n, self.cap = n, cap
        beam = generator.beam_size
        self.rows = torch.arange(src.size(0), device=src.device).repeat_interleave(beam)
        self.k = torch.zeros_like(self.rows)
        self.c = torch.zeros_like(self.rows)

    def _refuse(self, sample, fewest, n, limit):
        """A segment whose ``n`` sentences of ``m`` tokens do not fit (error
        path: reads the failing row)."""
        r = int(torch.argmax(fewest))
        ids = sample.get("id")
        sid = int(ids[r]) if ids is not None else r
        where = f"{self.describe(sid)}, " if self.describe is not None else ""
        raise InputError(
            f"segment {sid} ({where}batch row {r}): its {int(n[r])} sentences need at least "
            f"{int(fewest[r])} target tokens with --doc2doc-min-sentence-len {self.m} (and the "
            f"separators), but the model's maximum target positions allow {limit}; lower "
            "--doc2doc-max-tokens so that segments have fewer sentences")

    def __enter__(self):
        g = self.gen
        saved = {"max_len_a": g.max_len_a, "max_len_b": g.max_len_b}
        g.max_len_a, g.max_len_b = 0, self.max_len
        return self._wrap_model(saved)

    def at_maximum(self, hypos) -> torch.Tensor:
        """``[reached, sentences, capped]`` (a 3-vector on the device): over
        the best hypothesis of each row of the call's batch (``hypos`` as the
        generator returns them, in batch order; a row without one is left
        out), the sentences whose length reached their maximum ``L_i`` (the
        frame ended them there: cut, unless the sentence was that long
        anyway), all sentences, and, where the model's positions capped the
        output below the frame's sum, the rows whose output reached that cap
        ``T`` (their sentences may have ended before ``L_i``; 0 where not
        capped). Read by the caller once per batch, after the search."""
        pad = self.gen.pad
        dev = self.cap.device
        best = [h[0]["tokens"].to(dev) if h else torch.full((1,), self.eos, device=dev)
                for h in hypos]
        has = torch.tensor([bool(h) for h in hypos], device=dev)
        out = torch.nn.utils.rnn.pad_sequence(best, batch_first=True, padding_value=pad)
        _, lengths = source_sentence_lengths(out, self.sep, self.eos, pad)
        w = min(lengths.size(1), self.cap.size(1))
        in_row = ((torch.arange(w, device=dev).unsqueeze(0) < self.n.unsqueeze(1))
                  & has.unsqueeze(1))
        reached = (lengths[:, :w].ge(self.cap[:, :w]) & in_row).sum()
        generated = out.ne(pad).sum(1) - 1  # without the final </s>
        capped = (generated.ge(self.max_len) & has).sum() if self.capped else \
            torch.zeros((), dtype=torch.long, device=dev)
        return torch.stack([reached, in_row.sum(), capped])

    def reorder_incremental_state(self, incremental_states, new_order):
        self.rows = self.rows.index_select(0, new_order)
        self.k = self.k.index_select(0, new_order)
        self.c = self.c.index_select(0, new_order)
        return self.inner["reorder_incremental_state"](incremental_states, new_order)

    def forward_decoder(self, tokens, *args, **kwargs):
        lprobs, attn = self.inner["forward_decoder"](tokens, *args, **kwargs)
        return self.constrain(tokens, lprobs), attn

    def constrain(self, tokens: torch.Tensor, lprobs: torch.Tensor) -> torch.Tensor:
        """``lprobs`` (hypotheses x vocabulary) of the step that follows
        ``tokens`` with the frame's forbidden tokens at ``-inf``; the state
        ``k``, ``c`` advanced by ``tokens``' last token first."""
        step = tokens.size(1) - 1  # tokens generated so far (the first is the BOS)
        if step > 0:
            was_sep = tokens[:, -1].eq(self.sep)
            self.k = self.k + was_sep.long()
            self.c = torch.where(was_sep, torch.zeros_like(self.c), self.c + 1)
        m, k, c = self.m, self.k, self.c
        n = self.n.index_select(0, self.rows)
        left = n - 1 - k  # separators still to come
        cap_k = self.cap[self.rows, k.clamp(max=self.cap.size(1) - 1)]
        need = (m - c - 1).clamp(min=0) + left * (m + 1)
        regular_ok = c.lt(cap_k) & (need + step + 1).le(self.max_len)
        ended = c.ge(m)
        sep_col = lprobs[:, self.sep].masked_fill(~(ended & left.gt(0)), -math.inf)
        eos_col = lprobs[:, self.eos].masked_fill(~(ended & left.eq(0)), -math.inf)
        # the other tokens: one in-place add of 0 or -inf per hypothesis (the step's own tensor)
        lprobs.add_(torch.zeros_like(lprobs[:, 0]).masked_fill(~regular_ok, -math.inf)
                    .unsqueeze(1))
        lprobs[:, self.sep] = sep_col
        lprobs[:, self.eos] = eos_col
        return lprobs
