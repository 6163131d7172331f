"""Contrastive evaluation: does the model score the correct translation above
every contrastive one (same sentence, a wrong context-dependent word)?

``ctx-score-contrastive --path CKPT --data BIN --format FMT --contrastive FILE``
is the one scorer for every architecture and every suite
(:mod:`ctx_fairseq.eval.scoring.contrastive_suites` reads the formats: ``toy``,
``contrapro``, ``voita``, ``bawden``, ``lopes``).

How a candidate is scored
    The sum of the log-probabilities of its target tokens (``</s>`` included)
    under teacher forcing, the model's ``get_normalized_probs`` of one forward
    pass, as fairseq's validation computes them. Only the current sentence's
    tokens are scored; context sentences are inputs.

Context, built by the task as in training
    The task and model options are restored from the checkpoint. A checkpoint
    trained with ``--task document_translation`` and context is given the
    context it was trained with, built by the task's own dataset
    (:meth:`~ctx_fairseq.tasks.document_translation.DocumentTranslationTask.wrap`:
    context sizes, direction, separator, truncation and document memory
    exactly as in training and ``fairseq-generate``; ``--context-ablation
    shuffled|random`` is the dataset's
    :class:`~ctx_fairseq.data.conditions.ContextCondition` of that name, the
    one way every scorer asks for a context, the task's options unchanged):

    * ``toy``: records point to lines of the binarized ``--split``; the dataset
      is that split, with the scored line's target replaced by the candidate;
      context comes from the real documents (any direction), target context
      from the references (only with ``--gold-target-context``).
    * the public suites: each example becomes a small document, the suite's
      context sentences followed by the current sentence, and the current
      sentence is scored. Suites give previous sentences only, and a fixed
      number of them: a checkpoint that needs following sentences
      (``--context-direction next|both``, ``--document-context offline``) or
      more previous sentences than the suite gives is an error, as is one with
      target context when the suite gives none. A whole-document model
      (``--document-context online``) sees every sentence the suite gives; the
      report says how many.

    A segment model (``--doc2doc``, ``transformer_gtrans``) scores each
    candidate as the last sentence of a segment of its previous sentences
    (:mod:`ctx_fairseq.eval.context_use.segment_context`: as many as the
    suite gives, or for ``toy`` as the document has, that fit in
    ``--doc2doc-max-tokens``), the context's translations a forced prefix of
    the target that is not scored; the target side of the context comes
    from the suite, or for ``toy`` from the references (only with
    ``--gold-target-context``); a suite without target context is refused.
    ``--context-ablation shuffled|random``: the previous sentences of
    another document, or random symbols in their place.

    Each candidate rank is scored in its own copy of the dataset with the same
    document structure, so under ``--context-ablation shuffled`` every
    candidate of an example gets the same (wrong) context. A sentence-level
    checkpoint is scored without context: that is the model it is.

Counting
    An example is *correct* when the correct candidate scores above every
    other by more than ``--tie-tolerance`` (nats), a *tie* when the best other
    candidate is within the tolerance, and *wrong* otherwise. Accuracy is
    correct / examples; ties are reported separately (a model blind to the
    difference gives ties, not errors). Reported overall, per category and by
    antecedent distance (overall and per category), each with its counts.

Outputs
    The table is printed (or JSON with ``--json``) and written with its JSON and
    a PNG bar chart (accuracy by distance per category) to
    ``OUT_DIR/contrastive_{name}.{md,json,png}``; ``--scores-out FILE`` writes
    one loss (negative log-probability: lower is better, the default of
    ContraPro's, Bawden's and Voita's evaluation scripts) per candidate in the
    suite's own line order, for the suites' official scripts.

Raw text is turned into the model's units with fairseq's ``--tokenizer`` /
``--bpe`` options (:mod:`ctx_fairseq.eval.text_units`); the report gives the
share of ``<unk>`` tokens.
"""

import argparse
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.data.contract import ContextSpec, sentence_level, task_options
from ctx_fairseq.eval.context_use.segment_context import (describe, is_segment_model,
                                                          segment_dataset_for)
from ctx_fairseq.eval.scoring.contrastive_suites import FORMATS, Suite
from ctx_fairseq.eval.scoring.suite_report import (
    accuracy_bar_plot, add_output_args, add_suite_args, group_outcomes, pct, print_report,
    report_name, result_rows, SuiteOptions, parse_suite_args, write_report_files)
from ctx_fairseq.eval.text_units import TextEncoder, add_text_unit_args
from ctx_fairseq.tasks.context_options import task_setting

logger = logging.getLogger(__name__)

__all__ = ["ContrastiveScorer", "load_checkpoint", "summarize", "evaluate_checkpoint",
           "format_result", "write_report", "cli_main"]


class ContextUnavailable(ValueError):
    """The checkpoint needs context the suite does not give."""


def load_checkpoint(path: str, data: str, cuda: bool = False):
    """(model, task, cfg) with the checkpoint's task and model options
    (:func:`ctx_fairseq.eval.checkpoints.restore_checkpoint`); ``data`` gives
    the dictionaries (and, for the toy format, the split). The context a
    scorer gives is its :class:`~ctx_fairseq.data.conditions.ContextCondition`,
    never a change of the task's options."""
    from ctx_fairseq.eval.checkpoints import restore_checkpoint

    return restore_checkpoint(path, data, {}, "cuda" if cuda else "cpu")


def check_ablation(path: str, task, ablation: str) -> None:
    """``--context-ablation`` (``shuffled`` / ``random``) needs a checkpoint
    that reads context; a clear error names the checkpoint otherwise."""
    if ablation == "none":
        return
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    if not isinstance(task, DocumentTranslationTask):
        raise ValueError(f"--context-ablation {ablation}: {path} was trained with --task "
                         f"{task_setting(task, '_name') or type(task).__name__} (no context to "
                         "ablate)")
    if not uses_context(task):
        raise ValueError(f"--context-ablation {ablation}: {path} uses no context (--source-"
                         "context-size 0, --target-context-size 0): no context to ablate")


def uses_context(task) -> bool:
    """Whether the checkpoint reads context: context inputs, concatenated
    context, or (``--doc2doc``) the previous sentences of its segment."""
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    return isinstance(task, DocumentTranslationTask) and (task.uses_context
                                                          or is_segment_model(task))


class ContrastiveScorer:
    """Scores every candidate of a :class:`Suite` with ``model`` (see the
    module docstring)."""

    def __init__(self, model, task, src_encoder: TextEncoder, tgt_encoder: TextEncoder,
                 batch_size: int = 32, max_tokens: Optional[int] = None, split: str = "test",
                 gold_target_context: bool = False, allow_partial_document: bool = False,
                 condition: Optional[ContextCondition] = None):
        if batch_size < 1:
            raise ValueError("--batch-size must be >= 1")
        #: the context given (the one context-condition API; ``true``: as trained)
        self.condition = condition if condition is not None else ContextCondition("true")
        if self.condition.kind != "true" and not uses_context(task):
            raise ValueError(f"context condition {self.condition}: the model reads no context")
        self.model, self.task = model, task
        #: the checkpoint's context specification (another task's: none)
        self.spec: ContextSpec = task_options(task) or sentence_level()
        self.src_enc, self.tgt_enc = src_encoder, tgt_encoder
        self.batch_size, self.max_tokens, self.split = batch_size, max_tokens, split
        self.gold_target_context = gold_target_context
        self.allow_partial_document = allow_partial_document
        self.context = uses_context(task)
        self._cache: Dict[Tuple[str, str], torch.Tensor] = {}
        self.notes: List[str] = []

    @property
    def segments(self) -> bool:
        """A segment model (``--doc2doc``): its context is the rest of its
        segment (read from the checkpoint's context specification)."""
        return str(getattr(self.spec, "doc2doc", "none") or "none") != "none"

    # ------------------------------------------------------------------ text
    def _enc(self, side: str, text: str) -> torch.Tensor:
        key = (side, text)
        if key not in self._cache:
            enc = self.src_enc if side == "src" else self.tgt_enc
            self._cache[key] = enc.encode(text)
        return self._cache[key]

    def _eos_only(self) -> torch.Tensor:
        return torch.tensor([self.task.target_dictionary.eos()], dtype=torch.long)

    # --------------------------------------------------------------- checks
    def check_context(self, suite: Suite) -> None:
        """The checkpoint's context must be buildable from the suite."""
        if not self.context:
            return
        if self.segments:
            self._check_segment_context(suite)
            return
        c = self.spec
        if c.target_context_size > 0:
            if suite.context_sentences is None and not self.gold_target_context:
                raise ContextUnavailable(
                    f"the checkpoint uses target context (--target-context-size "
                    f"{c.target_context_size}); for the {suite.format} format it would come from "
                    "the reference translations of the split: pass --gold-target-context to "
                    "accept that")
            if suite.context_sentences is not None and not suite.target_context:
                raise ContextUnavailable(f"the checkpoint uses target context, but {suite.path} "
                                         "gives no target-side context")
        if suite.context_sentences is None:  # the split's real documents
            return
        if c.document_context == "offline" or (c.document_context in (None, "none")
                                               and c.context_direction != "prev"):
            what = ("--document-context offline" if c.document_context == "offline"
                    else f"--context-direction {c.context_direction}")
            raise ContextUnavailable(
                f"the checkpoint was trained with {what} (following sentences as context), but "
                f"the {suite.format} suite {suite.path} gives previous sentences only")
        if c.document_context == "online":
            if not self.allow_partial_document:
                raise ContextUnavailable(
                    "the checkpoint reads the whole document so far (--document-context online), "
                    f"but the {suite.format} suite {suite.path} gives at most "
                    f"{suite.context_sentences} previous sentence(s) per example: pass "
                    "--allow-partial-document to score it with those (reported), or score it on "
                    "whole documents (--format toy with a binarized split)")
            self.notes.append(
                f"whole-document model (--document-context online) scored with the up to "
                f"{suite.context_sentences} previous sentence(s) the suite gives "
                "(--allow-partial-document)")
            return
        need = max(c.source_context_size, c.target_context_size)
        if need > suite.context_sentences:
            raise ContextUnavailable(
                f"the checkpoint uses {need} previous sentence(s) of context, but {suite.path} "
                f"gives {suite.context_sentences} per example"
                + (" (--suite-context N chooses the Lopes et al. context files)"
                   if suite.format == "lopes" else ""))

    def _check_segment_context(self, suite: Suite) -> None:
        """A segment model's context is source and target sentences: their
        translations come from the suite, or (toy) from the references."""
        if suite.context_sentences is None:
            if not self.gold_target_context:
                raise ContextUnavailable(
                    "the checkpoint is a segment model (--doc2doc): the context sentences' "
                    "translations are the first part of its target, which for the toy format "
                    "come from the reference translations of the split: pass "
                    "--gold-target-context to accept that")
            self.notes.append(describe(self.task) + "; context: the split's previous "
                              "sentences, their references as the target context")
            return
        if not suite.target_context and suite.context_sentences > 0:
            raise ContextUnavailable(
                f"the checkpoint is a segment model (--doc2doc): its target holds the context "
                f"sentences' translations, but {suite.path} gives no target-side context")
        self.notes.append(describe(self.task) + f"; context: the up to "
                          f"{suite.context_sentences} previous sentence(s) the suite gives")

    def _wrap(self, base, doc_ids, docids_path, tgt_ctx, generation: bool):
        """The dataset with context of ``base``: the task's ``wrap``, or for a
        segment model each sentence as the last of its segment."""
        if self.segments:
            return segment_dataset_for(self.task, base, doc_ids, docids_path,
                                       self.condition, generation=generation)
        return self.task.wrap(base, doc_ids, docids_path, tgt_ctx, generation=generation,
                              condition=self.condition)

    # ------------------------------------------------------------- datasets
    def _pair_dataset(self, src: List[torch.Tensor], tgt: List[torch.Tensor]):
        from fairseq.data import LanguagePairDataset

        c = self.spec
        return LanguagePairDataset(
            src, np.array([len(x) for x in src], dtype=np.int64), self.task.source_dictionary,
            tgt, np.array([len(x) for x in tgt], dtype=np.int64), self.task.target_dictionary,
            left_pad_source=c.left_pad_source, left_pad_target=c.left_pad_target, shuffle=False)

    def _corpus(self, suite: Suite):
        """The binarized split the toy records point to, checked."""
        split = self.split
        if split not in self.task.datasets:
            self.task.load_dataset(split)
        ds = self.task.datasets[split]
        base = getattr(ds, "base", ds)
        n = len(base)
        src = [base.src[i].long() for i in range(n)]
        if base.tgt is None:
            raise ValueError(f"split {split} has no target side")
        ref = [base.tgt[i].long() for i in range(n)]
        if self.segments:  # (a segment dataset's doc_index is per segment)
            from ctx_fairseq.data.docids import read_docids

            doc_ids = read_docids(ds.docids_path, expected=n)
        else:
            doc_ids = ([ds.doc_names[d] for d in ds.doc_index] if hasattr(ds, "doc_index")
                       else None)
        for ex in suite.examples:
            i = ex.corpus_line
            if not 0 <= i < n:
                raise ValueError(f"{ex.where}: id {i} is outside {split} ({n} sentences)")
            mine = self._enc("src", ex.source)
            if not torch.equal(mine, src[i]):
                d = self.task.source_dictionary
                raise ValueError(f"{ex.where}: id {i}: src {ex.source!r} differs from line {i} of "
                                 f"{split} ({d.string(src[i])!r}); expected the records of this "
                                 "data")
            if doc_ids is not None and ex.doc_id is not None and doc_ids[i] != ex.doc_id:
                raise ValueError(f"{ex.where}: line {i} of {split} is in document "
                                 f"{doc_ids[i]!r} ({ds.docids_path}), but the record says "
                                 f"{ex.doc_id!r}")
        return src, ref, doc_ids, getattr(ds, "docids_path", split)

    def rank_datasets(self, suite: Suite, generation: bool = False):
        """For each candidate rank ``c``: ``(dataset, rows)`` with ``rows[i]``
        the dataset index whose target is candidate ``c`` of example ``i``
        (-1 if the example has fewer candidates), under the scorer's
        condition. ``generation``: the task's generation datasets (generative
        accuracy: a ``--concat-context`` model's target context is the
        decoder's forced prefix, not part of the target)."""
        ranks = max(len(ex.candidates) for ex in suite.examples)
        out = []
        if suite.context_sentences is None:  # toy: the split's documents
            src, ref, doc_ids, docids_path = self._corpus(suite)
            for c in range(ranks):
                tgt = list(ref)
                rows = np.full(len(suite.examples), -1, dtype=np.int64)
                for i, ex in enumerate(suite.examples):
                    if c < len(ex.candidates):
                        tgt[ex.corpus_line] = self._enc("tgt", ex.candidates[c].target)
                        rows[i] = ex.corpus_line
                base = self._pair_dataset(src, tgt)
                if self.context:
                    tgt_ctx = ref if self.spec.target_context_size > 0 else None
                    ds = self._wrap(base, doc_ids, docids_path, tgt_ctx, generation)
                else:
                    ds = base
                out.append((ds, rows))
            return out
        if self.context and self.condition.ablation != "none":
            for ex in suite.examples:  # same document structure, same donors, every rank
                if len({len(ex.context(k)[0]) for k in range(len(ex.candidates))}) > 1:
                    raise ValueError(f"{ex.where}: the candidates have contexts of different "
                                     "lengths, so --context-ablation would give them different "
                                     "wrong contexts")
        for c in range(ranks):
            src, tgt, tctx, doc_ids = [], [], [], []
            rows = np.full(len(suite.examples), -1, dtype=np.int64)
            for i, ex in enumerate(suite.examples):
                k = c if c < len(ex.candidates) else 0  # same document structure in every rank
                if self.context:
                    s_ctx, t_ctx = ex.context(k)
                    if self.segments and s_ctx and t_ctx is None:
                        raise ContextUnavailable(
                            f"{ex.where}: candidate {k} has no target-side context; a segment "
                            "model's target holds the context sentences' translations")
                    if t_ctx is not None and len(t_ctx) != len(s_ctx):
                        raise ValueError(f"{ex.where}: candidate {k} has {len(t_ctx)} target "
                                         f"context sentences for {len(s_ctx)} source ones")
                    for j, s in enumerate(s_ctx):
                        src.append(self._enc("src", s))
                        t = self._enc("tgt", t_ctx[j]) if t_ctx is not None else self._eos_only()
                        tgt.append(t)
                        tctx.append(t)
                        doc_ids.append(f"example{i}")
                src.append(self._enc("src", ex.source))
                tgt.append(self._enc("tgt", ex.candidates[k].target))
                tctx.append(self._eos_only())  # never shown: the current sentence is last
                doc_ids.append(f"example{i}")
                if c < len(ex.candidates):
                    rows[i] = len(src) - 1
            base = self._pair_dataset(src, tgt)
            if self.context:
                use_t = self.spec.target_context_size > 0
                ds = self._wrap(base, doc_ids, suite.path, tctx if use_t else None, generation)
            else:
                ds = base
            out.append((ds, rows))
        return out

    # -------------------------------------------------------------- scoring
    def _batches(self, ds, rows: np.ndarray) -> List[np.ndarray]:
        """The dataset's own batching (as in training: ``--max-tokens``
        bounds the padded tensors with their context or document memory),
        at most ``batch_size`` rows per batch."""
        rows = np.asarray(rows, dtype=np.int64)
        if getattr(ds, "document_batching", False):
            order = np.sort(rows)  # documents kept together
        else:
            order = rows[np.argsort(np.asarray(ds.num_tokens_vec(rows)), kind="stable")]
        try:
            batches = ds.batch_by_size(order, max_tokens=self.max_tokens,
                                       max_sentences=self.batch_size)
        except AssertionError as err:  # fairseq's own batching of a sentence-level dataset
            raise ValueError(f"--max-tokens {self.max_tokens}: {err}") from None
        return [np.asarray(b, dtype=np.int64) for b in batches]

    @torch.no_grad()
    def score_rows(self, ds, rows: Sequence[int]) -> Dict[int, float]:
        """Sum of target log-probabilities of dataset rows ``rows``."""
        model = self.model
        device = next(model.parameters()).device
        pad = self.task.target_dictionary.pad()
        out: Dict[int, float] = {}
        for b in self._batches(ds, np.asarray(rows)):
            sample = ds.collater([ds[int(i)] for i in b])
            ni = {k: (v.to(device) if torch.is_tensor(v) else v)
                  for k, v in sample["net_input"].items()}
            net_output = model(**ni)
            lprobs = model.get_normalized_probs(net_output, log_probs=True)
            target = sample["target"].to(device)
            tok = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).double()
            tok = tok.masked_fill(target.eq(pad), 0.0)
            if "target_prefix_len" in sample:  # concatenation: the current sentence only
                plen = sample["target_prefix_len"].to(device)
                cols = torch.arange(target.size(1), device=device).unsqueeze(0)
                tok = tok.masked_fill(cols < plen.unsqueeze(1), 0.0)
            for i, s in zip(sample["id"].tolist(), tok.sum(-1).tolist()):
                out[int(i)] = float(s)
        return out

    def score(self, suite: Suite) -> List[List[float]]:
        """Per example, the score of each candidate."""
        self.check_context(suite)
        scores = [[float("nan")] * len(ex.candidates) for ex in suite.examples]
        cut = set()
        for c, (ds, rows) in enumerate(self.rank_datasets(suite)):
            wanted = rows[rows >= 0]
            if self.segments and suite.context_sentences is not None:
                cut.update(np.flatnonzero(ds.cut_by_limit[rows] & (rows >= 0)).tolist())
            got = self.score_rows(ds, wanted)
            for i, r in enumerate(rows.tolist()):
                if r >= 0:
                    scores[i][c] = got[r]
        if cut:
            self.notes.append(f"{len(cut)} example(s) had context sentences left out: the "
                              f"segment would have been longer than --doc2doc-max-tokens "
                              f"{self.spec.doc2doc_max_tokens} (the nearest kept)")
        for ex, s in zip(suite.examples, scores):
            if not all(np.isfinite(s)):
                raise RuntimeError(f"{ex.where}: a candidate was not scored or scored {s}; "
                                   "refusing to count it")
        return scores


# ------------------------------------------------------------------ report
def _group(outcomes: Sequence[str]) -> Dict:
    n = len(outcomes)
    correct = sum(o == "correct" for o in outcomes)
    ties = sum(o == "tie" for o in outcomes)
    return {"n": n, "correct": correct, "ties": ties, "wrong": n - correct - ties,
            "accuracy": correct / n if n else None}


def summarize(suite: Suite, scores: List[List[float]], tie_tolerance: float = 1e-4) -> Dict:
    """Outcome of every example and the accuracies (module docstring)."""
    outcomes = []
    for ex, s in zip(suite.examples, scores):
        best_other = max(v for j, v in enumerate(s) if j != ex.correct)
        margin = s[ex.correct] - best_other
        outcomes.append("correct" if margin > tie_tolerance else
                        "tie" if margin >= -tie_tolerance else "wrong")
    result = {"suite": suite.path, "format": suite.format, "tie_tolerance": tie_tolerance,
              **group_outcomes(suite, outcomes, _group)}
    result["examples"] = [{"where": ex.where, "outcome": o, "scores": s, "correct": ex.correct}
                          for ex, o, s in zip(suite.examples, outcomes, scores)]
    return result


def format_result(result: Dict) -> str:
    o = result["overall"]
    lines = [f"overall: {o['accuracy']:.3f} ({o['correct']}/{o['n']} correct, {o['ties']} ties)"]
    unk = result.get("unknown_rate") or {}
    if unk:
        lines.append("<unk> tokens: " + ", ".join(
            f"{side} {'-' if r is None else f'{100 * r:.2f}%'}" for side, r in unk.items()))
    if result.get("tie_tolerance") is not None:
        lines.append(f"ties: score differences within {result['tie_tolerance']:g} nats")
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    lines += ["", "| category | distance | n | correct | ties | wrong | accuracy % |",
              "|---|---|---:|---:|---:|---:|---:|"]

    for cat, dist, g in result_rows(result):
        lines.append(f"| {cat} | {dist} | {g['n']} | {g['correct']} | {g['ties']} | "
                     f"{g['wrong']} | {pct(g['accuracy'])} |")
    return "\n".join(lines)


def plot(result: Dict, png: str, title: str = "") -> None:
    """Accuracy with the tied share, by antecedent distance or category."""
    accuracy_bar_plot(result, png, title, "accuracy (%)", ties=True)


def write_report(result: Dict, out_dir: str, name: str) -> Dict[str, str]:
    """Table, JSON and PNG, each written whole or not at all."""
    return write_report_files(result, os.path.join(out_dir, f"contrastive_{name}"),
                              format_result, plot)


def write_scores(suite: Suite, scores: List[List[float]], path: str) -> None:
    """One loss (negative log-probability, lower is better: the default of
    ContraPro's, Bawden's and Voita's evaluation scripts) per candidate, in the
    suite's line order."""
    with open(path + ".partial", "w", encoding="utf-8") as f:
        for s in scores:
            for v in s:
                f.write(f"{-v:.6f}\n")
    os.replace(path + ".partial", path)


# --------------------------------------------------------------------- API
def evaluate_checkpoint(path: str, data: str, contrastive: str,
                        options: SuiteOptions = SuiteOptions(), tie_tolerance: float = 1e-4,
                        return_scores: bool = False):
    """Contrastive accuracy of a checkpoint on a suite (module docstring),
    read and scored as ``options`` says; ``(result, suite, scores)`` with
    ``return_scores``."""
    options.check(" (the public suites give their own context)")
    if tie_tolerance < 0:
        raise ValueError("--tie-tolerance must be >= 0")
    suite = options.read(contrastive)
    scorer = scorer_for_checkpoint(path, data, options)
    src_enc, tgt_enc = scorer.src_enc, scorer.tgt_enc
    scores = scorer.score(suite)
    result = summarize(suite, scores, tie_tolerance)
    result.update({
        "checkpoint": path, "context_ablation": options.ablation,
        "context": ("doc2doc segment: the previous sentences of the segment" if scorer.segments
                    else "document_translation task context" if scorer.context
                    else "none (sentence-level)"),
        "notes": scorer.notes,
        "unknown_rate": {"source": src_enc.unknown_rate(), "target": tgt_enc.unknown_rate()},
    })
    for side, rate in result["unknown_rate"].items():
        if rate is not None and rate > 0.05:
            scorer.notes.append(f"{100 * rate:.1f}% of the {side} tokens are <unk>: is the text "
                                "in the model's units (--tokenizer / --bpe)?")
    return (result, suite, scores) if return_scores else result


def scorer_for_checkpoint(path: str, data: str,
                          options: SuiteOptions = SuiteOptions()) -> "ContrastiveScorer":
    """The scorer of checkpoint ``path`` (:func:`load_checkpoint`) on the
    device, with the context ablation, text encoders (``text_args``: the
    defaults when None) and batches of ``options``: the one way the scorer
    and generative accuracy load a checkpoint."""
    model, task, cfg = load_checkpoint(path, data, cuda=not options.cpu)
    check_ablation(path, task, options.ablation)
    text_args = options.text_args
    if text_args is None:
        p = argparse.ArgumentParser()
        add_text_unit_args(p)
        text_args = p.parse_args([])
    src_enc, tgt_enc = TextEncoder.pair_from_args(text_args, task, cfg)
    return ContrastiveScorer(
        model, task, src_enc, tgt_enc, batch_size=options.batch_size,
        max_tokens=options.max_tokens, split=options.split,
        gold_target_context=options.gold_target_context,
        allow_partial_document=options.allow_partial_document,
        condition=ContextCondition("true" if options.ablation == "none" else options.ablation))


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-score-contrastive",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--data", required=True, help="binarized data directory (dictionaries; for "
                                                 "--format toy also the split)")
    p.add_argument("--contrastive", required=True,
                   help="the suite: a file (toy, contrapro, voita) or a prefix (bawden, lopes)")
    p.add_argument("--format", default="toy", choices=FORMATS)
    add_suite_args(p, "score with wrong context (Voita et al. 2018), document-level checkpoints",
                   "toy: checkpoints with target context take it from the references")
    p.add_argument("--batch-size", type=int, default=32, help="candidates per forward pass")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="also bound the padded tokens of a batch, context included")
    p.add_argument("--tie-tolerance", type=float, default=1e-4,
                   help="score differences up to this (nats) are ties (0: only equal scores, "
                        "as the suites' official scripts count)")
    p.add_argument("--scores-out", default=None,
                   help="write one loss (-log p, lower is better) per candidate in the suite's "
                        "line order, for the suites' official scripts")
    add_output_args(p, "score on the GPU")
    return p


def cli_main(argv=None) -> Dict:
    p = get_parser()
    args, options = parse_suite_args(p, argv)
    try:
        result, suite, scores = evaluate_checkpoint(
            args.path, args.data, args.contrastive, options, tie_tolerance=args.tie_tolerance,
            return_scores=True)
    except (OSError, ValueError) as err:
        p.error(str(err))
    paths = write_report(result, args.out_dir,
                         report_name(args.name, suite.name, args.context_ablation))
    if args.scores_out:
        write_scores(suite, scores, args.scores_out)
        paths["scores"] = args.scores_out
    print_report(result, paths, format_result, args.json)
    return result


if __name__ == "__main__":
    cli_main(sys.argv[1:])
