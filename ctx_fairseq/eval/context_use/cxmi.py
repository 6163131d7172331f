"""How much does a model use its context? CXMI and P-CXMI (``ctx-cxmi``).

Fernandes, Yin, Neubig, Martins (2021), *Measuring and Increasing Context
Usage in Context-Aware Machine Translation* (ACL), define the conditional
cross-mutual information of the context ``C`` and the translation ``Y`` given
the source ``X``, estimated with one model ``q`` that reads the context and the
same model without it::

    CXMI(C -> Y | X) = H_q(Y | X) - H_q(Y | X, C)
                     ~ -(1/N) sum_i log [ q(y_i | x_i) / q(y_i | x_i, C_i) ]

and its point-wise form per sentence or per target word (P-CXMI),
``log q(y | x, C) - log q(y | x)``; Fernandes et al. (2023), *When Does
Translation Require Context?* (ACL), rank words by P-CXMI to find the
phenomena that need context.

Here, for one checkpoint and one binarized split with document ids:

``lp_true[i, t]``
    ``log q(y_t | y_<t, x_i, C_i)`` of every reference token (``</s>``
    included) under teacher forcing, with the context the task builds in
    training and validation (target context: the references);
``lp_cond[i, t]``
    the same under a comparison condition, the context changed in the one
    place that builds it (the ``document_translation`` task's
    :class:`~ctx_fairseq.data.document_dataset.DocumentContextDataset`, also
    under ``--concat-context``):

    * ``shuffled``, ``random``: the task's ``--context-ablation`` (another
      document position's real context; random tokens in place of the context
      words), seeded by the checkpoint's ``--seed``;
    * ``none``: the empty context, the context cut to 0 sentences (the
      dataset's ``context_size=0``), the input a document's first sentence
      gets; for ``--concat-context`` the sentence alone; a document memory:
      every sentence made a document of its own.

``P-CXMI(t) = lp_true[i, t] - lp_cond[i, t]`` per token; a word's P-CXMI is the
sum over its subword tokens (the log-probability of the word).

The headline ``cxmi`` is the paper's: the true context against the empty one
(``none``), normalised as the paper's released code (neulab/contextual-mt)
does, the mean over sentences of the per-sentence mean token log-probability
difference; ``cxmi_per_token`` (sum / target tokens) and
``cxmi_per_sentence_sum`` (sum / sentences) beside it. Intervals are a
document block bootstrap (:func:`doc_bootstrap`: documents resampled whole;
none below ``MIN_BOOTSTRAP_DOCS`` documents, with a note). ``--context-size N``
scores the true context at N previous sentences (at most the checkpoint's
trained K: its ``--sample-context-size``, else its context size; a document
memory: the memory sentences at most N positions away, at most its
``--sample-context-size`` where it was trained with one, any N otherwise);
``--curve`` gives CXMI at every size ``0..K`` (a document memory: only one
trained with ``--sample-context-size`` K). ``shuffled`` and ``random`` are sensitivity
checks (Voita et al. 2018; Kim et al. 2019), not the paper's CXMI. The empty
context is in distribution only for a model trained with a sampled context
size (or context dropout); otherwise the notes say so.

Every condition is one pass over the task's own batches
(``task.get_batch_iterator``: the dataset's ``batch_by_size``, ``--max-tokens``
counting the context); tensors stay on the model's device and the per-token
log-probabilities of all batches are moved to the host once, after the loop.
Each reference token scored is checked against the split's target sentence
(the same tokens under every condition), and every sentence is scored once.

Models with a document memory (``--document-memory``,
``transformer_selective_doc``, ``transformer_selective_doc_dec``): the task's
memory ablations (``shuffled``: each document reads another document's
memory, the query still encoded from its own tokens; ``random``: memory
sentences of random tokens), and ``none``: one document per sentence, so no
memory sentence is visible (online the memory is empty; offline it holds only
the sentence itself, which the model never shows it), the sentence-level
translation the model gives a document's first sentence and a sentence whose
context ``--context-dropout`` dropped (tested against ``query_doc = -1``).

Segment models (``--doc2doc``, ``transformer_gtrans``): each sentence is
scored as the last sentence of a segment of its previous sentences, the
context's translations a forced prefix that is not scored, against the
sentence alone (``none``: the one-sentence segment, the sentence-level
sample); the true context holds as many previous sentences as fit in
``--doc2doc-max-tokens`` (``--context-size N``: at most N; ``--curve`` needs
it and runs ``0..N``); ``shuffled``: another document's previous sentences;
``random``: random symbols in their place
(:mod:`ctx_fairseq.eval.context_use.segment_context`).

Refused with a clear error (never a number): a sentence-level checkpoint (no
context to remove) and a split without ``{split}.docids``. The training
split's dropout (``--context-dropout``, ``--coword-dropout``) is never applied
here (only fairseq-train's training load gets it).

Outputs (written whole or not at all) in ``--out DIR``: ``cxmi.json`` (per
condition ``cxmi``, ``tokens`` and the rest), ``cxmi.md``, ``tokens.jsonl``
(one line per reference word: document, sentence, position, the BPE-merged
word, P-CXMI per condition, whether the word repeats a word of the previous
reference sentence), ``cxmi_hist.png`` (per-word P-CXMI) and
``cxmi_by_position.png`` (P-CXMI per token by sentence position in the
document). Word classes: :mod:`ctx_fairseq.eval.context_use.word_classes`;
``all words`` (and ``other``) are the reference's words without ``</s>``,
which is a class of its own line (one per sentence, never a word of the text:
its P-CXMI says whether the context tells the model where a sentence ends).
Each listed class keeps its per-word means (``by_word``) in ``cxmi.json``.

A checkpoint trained with its sentence-level path frozen
(``--freeze-sentence-level``, read from the checkpoint's own arguments:
:func:`sentence_level_frozen`) is the stage-1 model under the empty context,
so CXMI against ``none`` measures the adapter it added, not context use:
``cxmi.json`` flags it (``sentence_level_frozen``, ``co_primary:
"shuffled"``), ``shuffled`` is measured for it where the split has two
documents with context, and a note says so.
"""

import argparse
import collections
import logging
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ctx_fairseq.data.conditions import COMPARED, ContextCondition
from ctx_fairseq.data.contract import ContextSpec, sentence_level, task_options
from ctx_fairseq.eval.context_use.cxmi_classes import class_breakdown
from ctx_fairseq.eval.context_use.cxmi_outputs import format_result, write_outputs
from ctx_fairseq.eval.context_use.segment_context import (describe, is_segment_model,
                                                          segment_condition_dataset)
from ctx_fairseq.tasks.context_options import task_setting
from ctx_fairseq.eval.context_use.word_classes import (LANGUAGES, classes_for, load_word_classes,
                                           normalise)

logger = logging.getLogger(__name__)

#: the conditions the true context is compared with (the one vocabulary's)
CONDITIONS = COMPARED
#: the word ``merge_words`` gives the end of a sentence
EOS_WORD = "</s>"

__all__ = ["CONDITIONS", "CXMIError", "sentence_level_frozen", "checkpoint_sentence_level_frozen",
           "batch_logprobs", "token_logprobs", "condition_dataset",
           "merge_words", "compute_cxmi", "write_outputs", "cli_main"]


class CXMIError(ValueError):
    """The checkpoint or the split cannot be measured (sentence-level model,
    no document ids)."""


# ----------------------------------------------------------------- checkpoint
def load(path: str, data: str, cuda: bool):
    """``(model, task, cfg)`` restored as the contrastive scorer restores them
    (:func:`ctx_fairseq.eval.scoring.contrastive.load_checkpoint`), checked."""
    from ctx_fairseq.eval.scoring.contrastive import uses_context, load_checkpoint

    model, task, cfg = load_checkpoint(path, data, cuda=cuda)
    if not uses_context(task):
        name = task_setting(task, "_name") or type(task).__name__
        raise CXMIError(
            f"{path} is a sentence-level checkpoint (task {name}, no source or target "
            "context): CXMI compares a model with and without its context, and this one has "
            "none to remove. Give a checkpoint trained with --task document_translation and "
            "context (or --concat-context, or --doc2doc)")
    return model, task, cfg


def _spec(task) -> ContextSpec:
    """The checkpoint's context specification (a task without one: none)."""
    return task_options(task) or sentence_level()


def sentence_level_frozen(cfg, model=None) -> bool:
    """Whether the checkpoint was trained with its sentence-level path frozen
    (``--freeze-sentence-level``: only the context parameters trained), read
    from its own model arguments (``cfg.model``, else the model's ``args``).
    Against the empty context such a model is its stage-1 sentence model, so
    CXMI against ``none`` measures the adapter it added, not how it reads the
    context; its co-primary figure is CXMI against shuffled context."""
    for src in (cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None),
                getattr(model, "args", None), getattr(model, "cfg", None)):
        if src is None:
            continue
        v = src.get("freeze_sentence_level", None) if hasattr(src, "get") and \
            not isinstance(src, argparse.Namespace) else getattr(src, "freeze_sentence_level", None)
        if v is not None:
            return bool(v)
    return False


def checkpoint_sentence_level_frozen(path: str) -> bool:
    """:func:`sentence_level_frozen` of a checkpoint file, read without
    building the model (its stored ``cfg``, else its stored ``args``)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        cfg = {"model": state["args"]}
    return sentence_level_frozen(cfg or {})


def _memory(task) -> bool:
    return bool(_spec(task).document_memory)


def trained_context_size(task) -> Optional[int]:
    """The largest context size the checkpoint was trained at: its
    ``--sample-context-size`` K (every size 0..K seen in training), else its
    largest ``--source/--target-context-size`` (that size only, and the empty
    context of a document's first sentence). A document memory: its window
    (``--memory-window``, by default the ``--sampled-context-size`` K it was
    trained on), else None (the whole document, no bounded size); a
    whole-document context: None."""
    spec = _spec(task)
    if is_segment_model(task):  # as many previous sentences as fit in the segment
        return None
    if spec.document_memory:
        return spec.memory_window or None
    if spec.whole_document:
        return None
    return spec.sampled_context_size or max(spec.source_context_size,
                                            spec.target_context_size)


def condition_dataset(task, split: str, condition: str, context_size: Optional[int] = None):
    """The split's dataset under a context condition, from the task's one
    condition API (``task.condition_dataset``,
    :class:`~ctx_fairseq.data.conditions.ContextCondition`): the true context
    (``true``; with ``context_size`` N: each sentence's N nearest previous
    context sentences), an ablation (``shuffled``, ``random``, cut to N
    likewise), or the empty context (``none``: a bounded context cut to 0
    sentences; a document memory or whole-document context: each sentence
    alone in its document, so nothing of it is visible)."""
    if condition not in ("true",) + CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; expected one of {CONDITIONS}")
    from ctx_fairseq.data.docids import DocumentIdError

    if is_segment_model(task):
        size = None if condition == "none" else context_size
        kind = "previous" if condition == "true" and size is not None else condition
        return segment_condition_dataset(task, split, ContextCondition(kind, size))
    if context_size is not None and not _memory(task) and _spec(task).whole_document:
        raise CXMIError("--context-size: a whole-document context has no bounded context "
                        "size to set (score it without --context-size: true against none)")
    size = None if condition == "none" else context_size
    if condition == "true" and size is not None:  # previous-k, or a memory's window-k
        cond = ContextCondition("window" if _memory(task) else "previous", size)
    else:
        cond = ContextCondition(condition, size)
    try:
        return task.condition_dataset(split, cond)
    except DocumentIdError as err:
        raise CXMIError(f"split {split!r}: {err}. CXMI needs documents (the true context "
                        "comes from them)") from None
    except FileNotFoundError as err:
        raise CXMIError(f"split {split!r}: {err}") from None


def _has_context(ds) -> np.ndarray:
    """Per sentence: does the dataset give it any context?"""
    return getattr(ds, "inner", ds).sentences_with_context()


# -------------------------------------------------------------------- scoring
def batch_logprobs(model, net_input: Dict, target: torch.Tensor) -> torch.Tensor:
    """``B x T`` float32 log-probabilities of ``target`` (the model's
    ``get_normalized_probs`` of one forward pass, as fairseq's validation
    computes them), on the device of ``net_input`` and ``target``; no host
    read."""
    lprobs = model.get_normalized_probs(model(**net_input), log_probs=True)
    return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()


@torch.no_grad()
def token_logprobs(model, task, ds, max_tokens: Optional[int] = None,
                   batch_size: Optional[int] = None) -> List[np.ndarray]:
    """Per sentence (dataset index) the log-probabilities (float64) of its
    reference tokens, ``</s>`` included, under teacher forcing: one pass over
    the task's batches, one host read at the end."""
    from fairseq import utils

    model.eval()
    device = next(model.parameters()).device
    pad = task.target_dictionary.pad()
    itr = task.get_batch_iterator(
        dataset=ds, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, num_workers=0, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    pieces: List[torch.Tensor] = []
    meta = []  # host-side: ids, target, the mask of the current sentence's tokens
    for sample in itr:
        if not sample:
            continue
        target = sample["target"]  # host copies stay for the bookkeeping below
        on_device = utils.apply_to_sample(lambda t: t.to(device), sample["net_input"])
        pieces.append(batch_logprobs(model, on_device, target.to(device)).reshape(-1))
        keep = target.ne(pad).numpy()
        if "target_prefix_len" in sample:  # concatenation: the current sentence only
            cols = np.arange(target.size(1))[None, :]
            keep &= cols >= sample["target_prefix_len"].numpy()[:, None]
        meta.append((sample["id"].numpy(), target.numpy(), keep))
    flat = (torch.cat(pieces).cpu().numpy().astype(np.float64) if pieces
            else np.zeros(0))  # the one host read
    n = len(ds)
    out: List[Optional[np.ndarray]] = [None] * n
    base = ds.base
    at = 0
    for ids, target, keep in meta:
        rows = flat[at:at + target.size].reshape(target.shape)
        at += target.size
        for r, i in enumerate(ids.tolist()):
            if out[i] is not None:
                raise RuntimeError(f"sentence {i} was scored twice")
            ref = base.tgt[i].numpy()
            got = target[r][keep[r]]
            if not np.array_equal(got, ref):
                raise RuntimeError(f"sentence {i}: the scored target tokens {got.tolist()} are "
                                   f"not the reference {ref.tolist()}")
            out[i] = rows[r][keep[r]]
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise RuntimeError(f"{len(missing)} sentence(s) were not scored (first: {missing[:5]})")
    bad = [i for i, v in enumerate(out) if not np.isfinite(v).all()]
    if bad:
        raise RuntimeError(f"non-finite log-probabilities in {len(bad)} sentence(s) (first: "
                           f"{bad[:5]}); refusing to report CXMI")
    return out  # type: ignore[return-value]


# ---------------------------------------------------------------------- words
def merge_words(symbols: Sequence[str], bpe: Optional[str] = None) -> List[tuple]:
    """``[(word, start, end)]``: the BPE-merged words of a token sequence, each
    covering ``symbols[start:end]``. ``subword_nmt`` style (``@@`` ends a
    non-final piece) unless ``bpe`` is ``sentencepiece`` (``▁`` starts a
    word). ``</s>`` is a word of its own."""
    words, cur, start = [], "", 0
    if bpe == "sentencepiece":
        for t, s in enumerate(symbols):
            if s == EOS_WORD or s.startswith("\u2581") or t == 0:
                if t > start:
                    words.append((cur, start, t))
                cur, start = (EOS_WORD if s == EOS_WORD else s.lstrip("\u2581")), t
                if s == EOS_WORD:
                    words.append((cur, t, t + 1))
                    cur, start = "", t + 1
            else:
                cur += s
        if start < len(symbols):
            words.append((cur, start, len(symbols)))
        return words
    for t, s in enumerate(symbols):
        if s.endswith("@@"):
            cur += s[:-2]
            continue
        words.append((cur + s, start, t + 1))
        cur, start = "", t + 1
    if cur:  # a dangling piece
        words.append((cur, start, len(symbols)))
    return words


def _bpe_name(cfg) -> Optional[str]:
    bpe = cfg.get("bpe") if hasattr(cfg, "get") else getattr(cfg, "bpe", None)
    if bpe is None:
        return None
    return bpe.get("_name") if hasattr(bpe, "get") else str(bpe)


# -------------------------------------------------------------------- compute
#: fewer documents than this: no document-bootstrap interval (a caveat instead)
MIN_BOOTSTRAP_DOCS = 10
BOOTSTRAP_RESAMPLES = 1000
NORMALISATION = {
    "cxmi": "mean over sentences of the per-sentence mean reference-token log-probability "
            "difference (Fernandes et al. 2021; contextual-mt averages fairseq's "
            "SequenceScorer score, the per-sentence mean, over sentences)",
    "cxmi_per_token": "sum of the token log-probability differences / target tokens",
    "cxmi_per_sentence_sum": "sum of the token log-probability differences / sentences (the "
                             "per-sentence sum, averaged)",
}


def doc_bootstrap(num: np.ndarray, den: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = 0, minus: Optional[tuple] = None) -> Dict:
    """A 95 % percentile interval of ``sum(num) / sum(den)`` by a document
    block bootstrap: the documents (one entry of ``num``/``den`` each) drawn
    with replacement ``resamples`` times (numpy's generator seeded with
    ``seed``), every sentence of a drawn document with it, so that sentences
    of one document, which are not independent, move together. ``minus``:
    ``(num2, den2)`` whose ratio is subtracted on the same draws (a paired
    difference). With fewer than ``MIN_BOOTSTRAP_DOCS`` documents no
    interval is given (``low``/``high`` None and a ``note``): resampling two
    documents says nothing about the spread."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    out = collections.OrderedDict(method=f"document block bootstrap, percentile, {resamples} "
                                         f"resamples of the {n} documents, seed {seed}",
                                  documents=n)
    if n < MIN_BOOTSTRAP_DOCS:
        out["low"] = out["high"] = None
        out["note"] = (f"{n} document(s): too few for a document bootstrap (at least "
                       f"{MIN_BOOTSTRAP_DOCS}); no interval (the sentences of a document are "
                       "not independent draws, so a sentence bootstrap would be too tight)")
        return out
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = num[idx].sum(axis=1) / den[idx].sum(axis=1)
        if minus is not None:
            n2, d2 = (np.asarray(x, dtype=np.float64) for x in minus)
            boot = boot - n2[idx].sum(axis=1) / d2[idx].sum(axis=1)
    ok = np.isfinite(boot)
    if ok.sum() < 0.9 * resamples:
        out["low"] = out["high"] = None
        out["note"] = f"only {int(ok.sum())} of {resamples} resamples had the words measured"
        return out
    low, high = np.percentile(boot[ok], [2.5, 97.5])
    out["low"], out["high"] = float(low), float(high)
    return out


def _per_doc(values: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    return np.bincount(doc, weights=np.asarray(values, dtype=np.float64), minlength=n_docs)


def _summary(lp_a: List[np.ndarray], lp_b: List[np.ndarray], doc: np.ndarray, n_docs: int,
             seed: int) -> Dict:
    """CXMI of ``a`` against ``b`` in the three normalisations, the paper's
    first, with document-bootstrap intervals."""
    counts = np.array([len(v) for v in lp_a], dtype=np.float64)
    diff = np.array([a.sum() - b.sum() for a, b in zip(lp_a, lp_b)])
    mean_diff = np.array([a.mean() - b.mean() for a, b in zip(lp_a, lp_b)])
    ones = np.ones(len(diff))
    e = collections.OrderedDict()
    e["cxmi"] = float(mean_diff.mean())
    e["cxmi_per_token"] = float(diff.sum() / counts.sum())
    e["cxmi_per_sentence_sum"] = float(diff.mean())
    e["interval"] = doc_bootstrap(_per_doc(mean_diff, doc, n_docs), _per_doc(ones, doc, n_docs),
                                  seed=seed)
    e["interval_per_token"] = doc_bootstrap(_per_doc(diff, doc, n_docs),
                                            _per_doc(counts, doc, n_docs), seed=seed)
    e["normalisation"] = NORMALISATION
    return e, diff, mean_diff


@dataclass(frozen=True)
class CXMIOptions:
    """What :func:`compute_cxmi` measures besides the split: the batches
    (``max_tokens``, ``batch_size``), the words' language or classes
    (``lang``, ``word_classes``), the top words (``top`` of those seen
    ``min_count`` times), the true context's size (``context_size``; default
    the trained one), the curve over sizes ``0..K`` and the bootstrap's
    ``seed``."""

    max_tokens: Optional[int] = 4096
    batch_size: Optional[int] = None
    lang: Optional[str] = None
    word_classes: Optional[Dict[str, List[str]]] = None
    top: int = 20
    min_count: int = 3
    context_size: Optional[int] = None
    curve: bool = False
    seed: int = 0


def _check_request(task, conditions: Sequence[str], context_size: Optional[int], curve: bool):
    """``(conditions, trained_k, n_size)``: the conditions (``none`` first,
    the headline), the checkpoint's trained size and the true context's size,
    each checked against what the checkpoint was trained with."""
    conditions = list(dict.fromkeys(conditions))
    for c in conditions:
        if c not in CONDITIONS:
            raise ValueError(f"--conditions: unknown condition {c!r}; expected some of "
                             f"{','.join(CONDITIONS)}")
    if "none" in conditions:  # the headline: true against the empty context
        conditions.remove("none")
    conditions.insert(0, "none")
    trained_k = trained_context_size(task)
    spec = _spec(task)
    if context_size is not None:
        if isinstance(context_size, bool) or int(context_size) != context_size or \
                context_size < 0:
            raise ValueError(f"--context-size must be an integer >= 0, got {context_size!r}")
        if trained_k is None and not _memory(task) and not is_segment_model(task):
            raise CXMIError("--context-size: this checkpoint reads a whole-document context, "
                            "which has no bounded context size")
        if trained_k is not None and context_size > trained_k:
            raise CXMIError(
                f"--context-size {context_size} is larger than the checkpoint was trained with "
                f"(K = {trained_k}: --sampled-context-size {spec.sampled_context_size}, "
                f"--memory-window {spec.memory_window}, --source-context-size "
                f"{spec.source_context_size}, --target-context-size "
                f"{spec.target_context_size}); it never saw that many sentences")
    if curve and is_segment_model(task) and context_size is None:
        raise CXMIError("--curve of a segment model (--doc2doc) runs over the context sizes "
                        "0..N: give --context-size N (its segments have no trained size)")
    if curve and trained_k is None and not is_segment_model(task):
        raise CXMIError("--curve: this checkpoint reads a whole-document context or a document "
                        "memory without a window (--memory-window), which has no bounded "
                        "context size to vary")
    # a checkpoint reading next (or both) sentences: its true context is its whole
    # window (no size to cut), against the empty context (size 0, any direction)
    prev_only = spec.context_direction == "prev"
    if not prev_only and (curve or (context_size is not None and context_size > 0)):
        raise CXMIError(f"--context-size / --curve count previous sentences; this checkpoint "
                        f"reads --context-direction {spec.context_direction} (score it "
                        "without them: its whole context against none)")
    n_size = context_size if context_size is not None else (trained_k if prev_only else None)
    return conditions, trained_k, n_size


def _check_shuffled(true_ds, split: str) -> None:
    """Shuffled context is another document's: with fewer than two documents
    whose sentences have context there is none to draw (the dataset would
    fall back to the same document's context or memory, and CXMI would mean
    nothing)."""
    inner = getattr(true_ds, "inner", true_ds)
    with_ctx = np.unique(inner.doc_index[_has_context(true_ds)])
    if len(with_ctx) < 2:
        raise CXMIError(
            f"split {split!r}: the shuffled condition takes each sentence's context from "
            f"another document, but only {len(with_ctx)} document(s) of "
            f"{len(inner.doc_start)} have sentences with context; measure on a split with "
            "two or more documents, or leave shuffled out of --conditions")


class _Scores:
    """The token log-probabilities of one split under each condition, with
    what the summaries need of them."""

    def __init__(self, lp, true_ds):
        self.lp = lp
        self.has_ctx = _has_context(true_ds)
        self.n = len(true_ds)
        self.counts = np.array([len(v) for v in lp["true"]], dtype=np.int64)
        self.tokens = int(self.counts.sum())
        self.sums = {k: np.array([v.sum() for v in lp[k]]) for k in lp}
        self.doc = np.asarray(true_ds.doc_index, dtype=np.int64)
        self.n_docs = len(true_ds.doc_start)


def _condition_entry(sc: _Scores, c: str, seed: int):
    """One comparison's summary (``result[c]``) and its per-sentence differences."""
    entry, diff, _ = _summary(sc.lp["true"], sc.lp[c], sc.doc, sc.n_docs, seed)
    entry["tokens"] = sc.tokens
    entry["sentences"] = sc.n
    t_ctx = int(sc.counts[sc.has_ctx].sum())
    entry["cxmi_sentences_with_context"] = (float(diff[sc.has_ctx].sum() / t_ctx) if t_ctx
                                            else None)
    entry["tokens_sentences_with_context"] = t_ctx
    entry["logprob_per_token"] = float(sc.sums[c].sum() / sc.tokens)
    entry["sentences_better_with_context"] = int((diff > 0).sum())
    entry["sentences_worse_with_context"] = int((diff < 0).sum())
    entry["role"] = ("headline (Fernandes et al. 2021)" if c == "none" else
                     "sensitivity check (Voita et al. 2018; Kim et al. 2019): "
                     + ("another document position's real context" if c == "shuffled"
                        else "random tokens in place of the context words"))
    return entry, diff


def _distribution_notes(result, n_size, trained_k, trained_dropout) -> List[str]:
    """Where the conditions are out of the distribution the model was trained on."""
    notes = []
    if trained_dropout <= 0 and not result["sample_context_size"]:
        notes.append(
            "none: the model was trained without a sampled context size or context dropout, so "
            "the empty context (as a document's first sentence has) is out of distribution for "
            f"the other sentences; CXMI against none {result['none']['cxmi']:.4f} mixes context "
            "use with that shift (train with --sampled-context-size for the paper's setting)")
    elif n_size is not None and result["sample_context_size"] == 0 and \
            0 < n_size < (trained_k or 0):
        notes.append(f"context size {n_size}: trained at {trained_k} only (no "
                     "--sampled-context-size), so this size is out of distribution")
    if n_size is not None and trained_k is None:
        notes.append(f"context size {n_size}: a window on a document memory trained on whole "
                     "documents (no --sampled-context-size), so this window is out of "
                     "distribution")
    return notes


def _segment_notes(task, n_size, cut: int) -> List[str]:
    """Where a segment model's conditions are out of its training
    distribution."""
    spec = task_options(task) or sentence_level()
    mode = str(spec.doc2doc)
    notes = []
    if mode == "greedy":
        notes.append("none: trained on greedy segments (--doc2doc greedy), the model saw a "
                     "sentence alone only at the start of a segment; CXMI against none mixes "
                     "context use with that shift (multi-resolution training, --doc2doc "
                     "multires, has one-sentence chunks)")
    if n_size is not None:
        notes.append(f"context size {n_size}: at most {n_size} previous sentence(s) per "
                     f"segment, within --doc2doc-max-tokens {spec.doc2doc_max_tokens} "
                     f"({cut} sentence(s) got fewer: the segment would have been longer)")
    return notes


def _curve(model, task, split, sc: _Scores, trained_k, n_size, opts: CXMIOptions):
    """CXMI at each context size ``0..K`` against the empty context."""
    points = []
    for k in range(trained_k + 1):
        if k == 0:
            lp_k = sc.lp["none"]
        elif k == n_size:
            lp_k = sc.lp["true"]
        else:
            lp_k = token_logprobs(model, task, condition_dataset(task, split, "true", k),
                                  opts.max_tokens, opts.batch_size)
        e, _, _ = _summary(lp_k, sc.lp["none"], sc.doc, sc.n_docs, opts.seed)
        points.append(collections.OrderedDict(
            context_size=k, cxmi=e["cxmi"], interval=e["interval"],
            cxmi_per_token=e["cxmi_per_token"], logprob_per_sentence_mean=float(
                np.mean([v.mean() for v in lp_k]))))
    return points


def _word_records(task, cfg, ds, lp, conditions) -> List[Dict]:
    """One record per reference word: its tokens, log-probability, P-CXMI
    per condition and whether it repeats a word of the previous reference
    sentence of its document."""
    d = task.target_dictionary
    bpe = _bpe_name(cfg)
    doc_names = np.asarray(ds.doc_names)
    words = []
    prev_words: set = set()
    for i in range(len(ds)):
        symbols = [d[t] for t in ds.base.tgt[i].tolist()]
        merged = merge_words(symbols, bpe)
        # the words of the previous reference sentence of the same document: a word
        # repeated from it (a surface repetition, punctuation included; a simple proxy,
        # not MuDA's aligned lexical-cohesion tag of Fernandes et al. 2023)
        if not (i > 0 and ds.doc_index[i - 1] == ds.doc_index[i]):
            prev_words = set()
        for w, (word, a, b) in enumerate(merged):
            rec = collections.OrderedDict()
            rec["doc"] = str(doc_names[ds.doc_index[i]])
            rec["sentence"] = i
            rec["sent_pos"] = int(ds.sent_pos[i])
            rec["position"] = w
            rec["word"] = word
            rec["tokens"] = [a, b]
            rec["logprob"] = float(lp["true"][i][a:b].sum())
            rec["p_cxmi"] = {c: float(lp["true"][i][a:b].sum() - lp[c][i][a:b].sum())
                             for c in conditions}
            # (</s> is in neither half: None)
            rec["in_previous_reference"] = None if word == EOS_WORD else \
                normalise(word) in prev_words
            words.append(rec)
        prev_words = {normalise(word) for word, _, _ in merged if word != EOS_WORD}
    return words


def _top_words(words, conditions, top: int, min_count: int):
    """Per condition, the ``top`` words by mean P-CXMI among those seen
    ``min_count`` times or more."""
    by_word = collections.defaultdict(list)
    for rec in words:
        by_word[rec["word"]].append(rec)
    out = {}
    for c in conditions:
        stats = [(w, len(rs), float(np.mean([r["p_cxmi"][c] for r in rs])))
                 for w, rs in by_word.items() if len(rs) >= min_count]
        stats.sort(key=lambda x: (-x[2], x[0]))
        out[c] = [{"word": w, "count": k, "mean_p_cxmi": m} for w, k, m in stats[:top]]
    return out


def _class_groups(words, pc, table, word_doc, n_docs, seed):
    """One condition's mean P-CXMI per word class, with document-bootstrap
    intervals, beside the mean over all words (and the difference class -
    all words, on the same draws)."""
    eos = np.array([r["word"] == EOS_WORD for r in words], dtype=bool)
    cls_of = np.array([EOS_WORD if e else table.get(normalise(r["word"]), "other")
                       for r, e in zip(words, eos)], dtype=object)
    flag = [r["in_previous_reference"] for r in words]
    halves = (np.array([f is True for f in flag]), np.array([f is False for f in flag]))
    # "all words": the reference's words, </s> (one per sentence, never a word
    # of the text) left out and reported on its own line
    word = ~eos
    all_num, all_den = _per_doc(np.where(word, pc, 0.0), word_doc, n_docs), \
        _per_doc(word.astype(np.float64), word_doc, n_docs)
    groups = collections.OrderedDict()
    groups["all words"] = {"count": int(word.sum()),
                           "mean_p_cxmi": float(pc[word].mean()) if word.any() else None,
                           "interval": doc_bootstrap(all_num, all_den, seed=seed)
                           if word.any() else None,
                           "words": None, "excludes": EOS_WORD}
    groups["all words"].update(class_breakdown(words, word, pc, "all words", halves))
    all_mean = float(pc[word].mean()) if word.any() else 0.0
    for name in list(dict.fromkeys(table.values())) + ["other", EOS_WORD]:
        m = cls_of == name
        num, den = _per_doc(np.where(m, pc, 0.0), word_doc, n_docs), \
            _per_doc(m.astype(np.float64), word_doc, n_docs)
        g = {"count": int(m.sum()),
             "mean_p_cxmi": float(pc[m].mean()) if m.any() else None,
             "interval": doc_bootstrap(num, den, seed=seed) if m.any() else None,
             "minus_all_words": (float(pc[m].mean() - all_mean) if m.any() else None),
             "minus_all_words_interval": (doc_bootstrap(num, den, seed=seed,
                                                        minus=(all_num, all_den))
                                          if m.any() else None),
             "words": sorted({r["word"] for r, k in zip(words, m) if k})
             if name not in ("other", EOS_WORD) else None}
        g.update(class_breakdown(words, m, pc, name, halves))
        groups[name] = g
    return groups


def _by_position(ds, sc: _Scores, diffs, conditions):
    """Per condition, CXMI per token by the sentence's position in its document."""
    pos = np.asarray(ds.sent_pos)
    out = {}
    for c in conditions:
        rows = collections.OrderedDict()
        for p in np.unique(pos).tolist():
            m = pos == p
            rows[str(p)] = {"sentences": int(m.sum()), "tokens": int(sc.counts[m].sum()),
                            "cxmi": float(diffs[c][m].sum() / max(int(sc.counts[m].sum()), 1))}
        out[c] = rows
    return out


def compute_cxmi(model, task, cfg, split: str, conditions: Sequence[str] = ("none",),
                 **options):
    """``(result, words)``: the summary (``cxmi.json``) and one record per
    reference word (``tokens.jsonl``). The headline ``cxmi`` is the true
    context (``context_size`` N previous sentences; default: every sentence of
    the context the checkpoint was trained with) against the empty context
    (``none``), the paper's CXMI; ``shuffled`` and ``random`` are sensitivity
    checks beside it. ``curve``: CXMI at every context size ``0..K`` (K the
    checkpoint's trained size) against the empty context (``result["curve"]``).
    ``options``: the fields of :class:`CXMIOptions`."""
    opts = CXMIOptions(**options)
    conditions, trained_k, n_size = _check_request(task, conditions, opts.context_size,
                                                   opts.curve)
    true_ds = condition_dataset(task, split, "true", n_size)
    frozen = sentence_level_frozen(cfg, model)
    frozen_note = None
    if frozen and "shuffled" not in conditions:
        try:  # its co-primary figure, measured where the split allows it
            _check_shuffled(true_ds, split)
            conditions.append("shuffled")
        except CXMIError as err:
            frozen_note = f"its co-primary figure, CXMI against shuffled context, is not " \
                          f"measured here: {err}"
    if "shuffled" in conditions:
        _check_shuffled(true_ds, split)
    lp = {"true": token_logprobs(model, task, true_ds, opts.max_tokens, opts.batch_size)}
    for c in conditions:
        lp[c] = token_logprobs(model, task, condition_dataset(task, split, c, n_size),
                               opts.max_tokens, opts.batch_size)
    sc = _Scores(lp, true_ds)
    if sc.tokens == 0:
        raise CXMIError(f"split {split!r} has no target tokens")
    spec = _spec(task)
    result = collections.OrderedDict()
    result["split"] = split
    result["sentences"] = sc.n
    result["documents"] = sc.n_docs
    result["tokens"] = sc.tokens
    result["sentences_with_context"] = int(sc.has_ctx.sum())
    result["context_size"] = n_size
    result["trained_context_size"] = trained_k
    result["sample_context_size"] = spec.sampled_context_size  # (the key of old)
    result["memory_window"] = spec.memory_window
    result["logprob_true_per_token"] = float(sc.sums["true"].sum() / sc.tokens)
    result["logprob_true_per_sentence_mean"] = float(np.mean([v.mean() for v in lp["true"]]))
    result["context_dropout"] = spec.context_dropout
    result["seed"] = spec.seed
    result["headline"] = ("cxmi: the true context against the empty context (condition none), "
                          "the paper's CXMI; shuffled and random are sensitivity checks")
    diffs = {}
    for c in conditions:
        result[c], diffs[c] = _condition_entry(sc, c, opts.seed)
    result["cxmi"] = result["none"]["cxmi"]
    result["cxmi_interval"] = result["none"]["interval"]
    if is_segment_model(task):
        result["segments"] = describe(task)
        result["segment_context_cut_by_limit"] = int(true_ds.cut_by_limit.sum())
        notes = _segment_notes(task, n_size, result["segment_context_cut_by_limit"])
    else:
        notes = _distribution_notes(result, n_size, trained_k, spec.context_dropout)
    result["sentence_level_frozen"] = frozen
    result["co_primary"] = "shuffled" if frozen else None
    if frozen:
        notes.append("the checkpoint was trained with its sentence-level path frozen "
                     "(--freeze-sentence-level): against the empty context it is the stage-1 "
                     "model, so CXMI against none measures the adapter it added, not context "
                     "use; CXMI against shuffled context is its co-primary figure"
                     + (f" ({frozen_note})" if frozen_note else ""))
    result["conditions"] = conditions
    result["target"] = "reference tokens including </s> (teacher forcing); target context " \
                       "from the references"
    if opts.curve:
        result["curve"] = _curve(model, task, split, sc,
                                 n_size if is_segment_model(task) else trained_k, n_size, opts)
    words = _word_records(task, cfg, true_ds, lp, conditions)
    result["top_words"] = _top_words(words, conditions, opts.top, opts.min_count)
    result["top_words_min_count"] = opts.min_count
    lang = opts.lang or task_setting(task, "target_lang")
    table = classes_for(lang, opts.word_classes)
    result["word_class_lang"] = "--word-classes file" if opts.word_classes else lang
    if table is None:
        result["word_classes"] = None
        notes.append(f"no word list for target language {lang!r} (built in: "
                     f"{', '.join(LANGUAGES)}; --lang or --word-classes FILE)")
    else:
        word_doc = np.array([true_ds.doc_index[r["sentence"]] for r in words], dtype=np.int64)
        result["word_classes"] = {
            c: _class_groups(words, np.array([r["p_cxmi"][c] for r in words]), table,
                             word_doc, sc.n_docs, opts.seed)
            for c in conditions}
    result["by_position"] = _by_position(true_ds, sc, diffs, conditions)
    result["notes"] = notes
    return result, words


# ------------------------------------------------------------------------ CLI
def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-cxmi", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="checkpoint (document_translation with context)")
    p.add_argument("--data", required=True, help="binarized data directory with {split}.docids")
    p.add_argument("--split", default="test", help="split to measure (default: test)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--conditions", default="none",
                   help="comparison conditions, comma-separated, of " + ",".join(CONDITIONS)
                        + " (default: none, the empty context, the paper's CXMI; always "
                          "measured; shuffled and random: sensitivity checks)")
    p.add_argument("--context-size", type=int, default=None,
                   help="score the true context with the N nearest previous sentences (a "
                        "document memory: its sentences at most N positions away; 0: empty); "
                        "at most the K the checkpoint was trained with (default: K)")
    p.add_argument("--curve", action="store_true",
                   help="also CXMI at every context size 0..K against the empty context "
                        "(curve.json, curve.png)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the document bootstrap (default: 0)")
    p.add_argument("--max-tokens", type=int, default=4096,
                   help="padded tokens per batch, context included (default: 4096)")
    p.add_argument("--batch-size", type=int, default=None, help="sentences per batch")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA is there")
    p.add_argument("--lang", default=None,
                   help=f"word-class language ({', '.join(LANGUAGES)}; default: the target "
                        "language of the checkpoint's task)")
    p.add_argument("--word-classes", default=None,
                   help='JSON {"class": ["word", ...]} replacing the built-in lists')
    p.add_argument("--top", type=int, default=20, help="top words listed per condition")
    p.add_argument("--min-count", type=int, default=3,
                   help="words seen fewer times are left out of the top list and of "
                        "cxmi.md's per-word rows of each class (default: 3)")
    return p


def run(args) -> Dict:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError("--batch-size must be >= 1")
    if args.context_size is not None and args.context_size < 0:
        raise ValueError(f"--context-size must be an integer >= 0, got {args.context_size}")
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    table = load_word_classes(args.word_classes) if args.word_classes else None
    cuda = not args.cpu and torch.cuda.is_available()
    model, task, cfg = load(args.path, args.data, cuda)
    result, words = compute_cxmi(model, task, cfg, args.split, conditions,
                                 max_tokens=args.max_tokens, batch_size=args.batch_size,
                                 lang=args.lang, word_classes=table, top=args.top,
                                 min_count=args.min_count, context_size=args.context_size,
                                 curve=args.curve, seed=args.seed)
    result["checkpoint"] = args.path
    result["device"] = "cuda" if cuda else "cpu"
    result["paths"] = write_outputs(result, words, args.out)
    return result


def cli_main(argv=None) -> Dict:
    p = get_parser()
    args = p.parse_args(argv)
    try:
        result = run(args)
    except (OSError, ValueError) as err:
        p.error(str(err))
    print(format_result(result))
    print("\nwritten: " + ", ".join(result["paths"].values()))
    return result


if __name__ == "__main__":
    cli_main(sys.argv[1:])
