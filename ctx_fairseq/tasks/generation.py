"""Generation helpers of the ``document_translation`` task: moving a batch the
task builds to the device fairseq handed it, choosing rows of a batch, the
best hypotheses' tokens on the host, ``--concat-context``'s forced target
prefixes in one generator call (:class:`ForcedPrefixes`) and the state of
``--own-target-context`` generation (:class:`OwnTargetContextState`)."""

import math
from typing import Dict, List, Sequence

import numpy as np
import torch
from fairseq import utils

from ctx_fairseq.data.document_dataset import DocumentContextDataset

__all__ = ["to_device", "batch_device", "select_rows", "best_tokens_on_cpu", "ForcedPrefixes",
           "OwnTargetContextState"]


def to_device(sample: Dict, device: torch.device) -> Dict:
    """Every tensor of a (re-)collated batch on ``device``, the device of the
    batch fairseq handed the task (fairseq-generate and fairseq-interactive
    move the whole batch, ``id`` and ``target`` included, to the GPU: a tensor
    left on the CPU meets GPU indices in the generator)."""
    return utils.apply_to_sample(lambda t: t.to(device), sample)


def batch_device(sample: Dict) -> torch.device:
    return sample["net_input"]["src_tokens"].device


def select_rows(sample: Dict, rows: Sequence[int]) -> Dict:
    """The rows ``rows`` of a collated batch (every tensor whose first
    dimension is the batch)."""
    bsz = sample["id"].numel()
    idx = torch.as_tensor(list(rows), dtype=torch.long)

    def pick(v):
        if torch.is_tensor(v) and v.dim() > 0 and v.size(0) == bsz:
            return v.index_select(0, idx.to(v.device))
        if isinstance(v, dict):
            return {k: pick(x) for k, x in v.items()}
        return v

    out = {k: pick(v) for k, v in sample.items()}
    out["nsentences"] = len(rows)
    return out


def best_tokens_on_cpu(hypos: List[List[dict]]) -> List[torch.Tensor]:
    """The best hypothesis's tokens of every sentence, on the CPU, read back
    from the device in one copy per batch (not one per sentence): padded into
    one tensor on the device, copied, split by the lengths (shapes, known on
    the host)."""
    best = [row[0]["tokens"].detach().long() for row in hypos]
    if not best:
        return []
    if all(t.device.type == "cpu" for t in best):
        return best
    lengths = [int(t.numel()) for t in best]
    flat = torch.cat(best).cpu()
    return list(torch.split(flat, lengths))


class GeneratorCallWrapper:
    """For one call of fairseq's ``SequenceGenerator`` (``self.gen``): its
    model wrapper's (``self.model``) ``forward_decoder`` and
    ``reorder_incremental_state`` replaced by this object's, and the
    generator's settings changed for the call restored afterwards (a context
    manager; the subclass's ``__enter__`` changes the settings and calls
    :meth:`_wrap_model`)."""

    _WRAPPED = ("forward_decoder", "reorder_incremental_state")

    def _wrap_model(self, saved: Dict):
        """Remember the generator's settings ``saved`` (restored on exit) and
        wrap the methods the model has now (an instance's own, e.g. a
        profiler's, kept and restored)."""
        self.saved = saved
        self.own = {k: self.model.__dict__[k] for k in self._WRAPPED
                    if k in self.model.__dict__}
        self.inner = {k: getattr(self.model, k) for k in self._WRAPPED}
        for k in self._WRAPPED:
            setattr(self.model, k, getattr(self, k))
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.gen, k, v)
        for k in self.inner:
            self.model.__dict__.pop(k, None)
            if k in self.own:
                setattr(self.model, k, self.own[k])
        return False


class ForcedPrefixes(GeneratorCallWrapper):
    """``--concat-context`` generation: every row's target context forced as
    the start of its hypotheses, in one call of fairseq's
    ``SequenceGenerator`` for the whole batch, rows of different prefix
    lengths together.

    fairseq forces a (padded) ``prefix_tokens`` but applies ``--min-len``, its
    ``tokens_to_suppress`` (the break symbol) and the length limit to the
    whole batch at once: suppression and ``--min-len`` only once every row has
    left its prefix, one ``max_len`` for all rows. So the task used to call
    the generator once per distinct prefix length. Here, for the duration of
    one call (a context manager), the generator's ``EnsembleModel`` applies
    per row, after the models' log-probabilities of each step (static shapes,
    no read back to the host):

    * row ``r`` with prefix ``p_r`` of ``n_r`` tokens, step ``t < n_r``: every
      token but ``p_r[t]`` gets ``-inf`` (its own log-probability kept, as
      fairseq's ``_prefix_tokens`` does; beam search then keeps one live beam
      through the prefix, as there);
    * ``t >= n_r``: the generator's suppressed tokens get ``-inf``, and
      ``</s>`` while ``t < n_r + min_len``;
    * ``t >= max_len_r = min(int(max_len_a * src_len + max_len_b) + n_r,
      max_len - 1)``: only ``</s>``;

    which is what a call for the rows of one prefix length did (``max_len_b``
    and ``min_len`` raised by ``n_r``), while the generator's own limits are
    set to the loosest (``max_len_b`` + the longest prefix; no suppression;
    its ``min_len`` unchanged, below every row's). Each row's beam search is
    independent of the others', so the hypotheses are those of the calls per
    length. The row of each hypothesis is followed through the generator's
    reorders (``reorder_incremental_state``, called with the new order of the
    rows at every step, finished sentences removed).

    ``--match-source-len`` (the limit from the concatenated source, per
    call) is refused. So is, before generation (from the prefix lengths,
    known on the host: no read back per step), a row whose limits cannot be
    met, with the sentence's id and its lengths named: a prefix that leaves
    no step for the translation (``max_len_r <= n_r``), and a row whose
    minimum length is beyond its maximum (``min_len_r = n_r + min_len >
    max_len_r``, e.g. ``--min-len >= 2`` with a context near the maximum
    target positions), which fairseq's own call per length refused by an
    assertion (``min_len <= max_len``) and which here would leave the row
    every token at ``-inf`` at step ``max_len_r`` (a wrong translation).
    Every row meeting both, the generator's own limits (``min_len`` at or
    below each row's, ``max_len`` at or above) hold too."""

    def __init__(self, generator, sample, plen: List[int]):
        self.gen = generator
        self.model = getattr(generator, "model", None)
        if self.model is None or not hasattr(self.model, "forward_decoder"):
            raise ValueError(f"--concat-context: generation needs fairseq's SequenceGenerator "
                             f"(its EnsembleModel); got {type(generator).__name__}")
        if getattr(generator, "match_source_len", False):
            raise ValueError("--match-source-len is not supported with --concat-context")
        src = sample["net_input"]["src_tokens"]
        device = src.device
        self.eos = generator.eos
        self.beam = generator.beam_size
        longest = max(plen)
        base = int(generator.max_len_a * src.size(1) + generator.max_len_b)
        limit = generator.max_len - 1
        self._check_lengths(sample, plen, base, limit, src.size(1))
        prefix = sample["target_prefix"]
        self.prefix = prefix[:, :longest].to(device)
        self.plen = sample["target_prefix_len"].to(device)
        self.max_len = (self.plen + base).clamp(max=limit)
        self.min_len = self.plen + generator.min_len
        sup = getattr(generator, "token_indices_to_suppress", None)
        self.suppress = sup.to(device) if sup is not None else None
        self.rows = torch.arange(len(plen), device=device).repeat_interleave(self.beam)
        self.longest = longest
        self.not_eos = None

    def _check_lengths(self, sample, plen: List[int], base: int, limit: int, src_len: int):
        """Every row's limits met (see the class): else an error naming the
        first failing row's sentence and its lengths. Host arithmetic on the
        prefix lengths; the sentence's id is read only to raise."""
        g = self.gen
        for r, n in enumerate(plen):
            max_len_r = min(base + n, limit)
            min_len_r = n + g.min_len
            if max_len_r > n and min_len_r <= max_len_r:
                continue
            ids = sample.get("id")
            sid = int(ids[r]) if ids is not None else r  # (error path only)
            how = (f"at most {max_len_r} target tokens fit: min(int(--max-len-a "
                   f"{g.max_len_a} * source length {src_len} + --max-len-b {g.max_len_b}) + "
                   f"{n}, the model's maximum target positions {g.max_len} - 1)")
            if max_len_r <= n:
                raise RuntimeError(
                    f"--concat-context: sentence {sid} (batch row {r}): its {n}-token target "
                    f"context leaves no step for the translation; {how}")
            raise RuntimeError(
                f"--concat-context: sentence {sid} (batch row {r}): its {n}-token target "
                f"context and --min-len {g.min_len} need at least {min_len_r} target tokens, "
                f"but {how}; lower --min-len, raise --max-len-a/--max-len-b, or shorten the "
                "target context (--target-context-size / the maximum target positions)")

    def __enter__(self):
        g = self.gen
        saved = {"max_len_b": g.max_len_b,
                 "token_indices_to_suppress": g.token_indices_to_suppress}
        g.max_len_b = g.max_len_b + self.longest
        g.token_indices_to_suppress = None
        return self._wrap_model(saved)

    def reorder_incremental_state(self, incremental_states, new_order):
        self.rows = self.rows.index_select(0, new_order)
        return self.inner["reorder_incremental_state"](incremental_states, new_order)

    def forward_decoder(self, tokens, *args, **kwargs):
        lprobs, attn = self.inner["forward_decoder"](tokens, *args, **kwargs)
        step = tokens.size(1) - 1
        rows = self.rows
        n = self.plen.index_select(0, rows)
        max_len = self.max_len.index_select(0, rows)
        if step < self.longest:
            tok = self.prefix[:, step].index_select(0, rows).unsqueeze(1)
            forced = torch.full_like(lprobs, -math.inf).scatter_(1, tok, lprobs.gather(1, tok))
            in_prefix = (n > step) & (max_len > step)
            lprobs = torch.where(in_prefix.unsqueeze(1), forced, lprobs)
        after = n <= step
        if self.suppress is not None:
            lprobs[:, self.suppress] = lprobs[:, self.suppress].masked_fill(
                after.unsqueeze(1), -math.inf)
        no_eos = after & (self.min_len.index_select(0, rows) > step)
        lprobs[:, self.eos] = lprobs[:, self.eos].masked_fill(no_eos, -math.inf)
        if self.not_eos is None:
            self.not_eos = torch.ones(lprobs.size(1), dtype=torch.bool, device=lprobs.device)
            self.not_eos[self.eos] = False
        return lprobs.masked_fill((max_len <= step).unsqueeze(1) & self.not_eos, -math.inf), attn


class OwnTargetContextState:
    """``--own-target-context``: which sentences of ``dataset`` are translated,
    and per document how many of its first sentences are (so "are the
    earlier sentences translated?" is one comparison)."""

    def __init__(self, dataset: DocumentContextDataset):
        self.dataset = dataset
        self.translated = np.zeros(len(dataset), dtype=bool)
        self.prefix = np.zeros(len(dataset.doc_start), dtype=np.int64)

    def ready(self, i: int) -> bool:
        ds = self.dataset
        return int(self.prefix[ds.doc_index[i]]) >= int(ds.sent_pos[i])

    def done(self, i: int) -> None:
        ds = self.dataset
        self.translated[i] = True
        d = int(ds.doc_index[i])
        start, n = int(ds.doc_start[d]), int(ds.doc_len[d])
        while self.prefix[d] < n and self.translated[start + self.prefix[d]]:
            self.prefix[d] += 1
