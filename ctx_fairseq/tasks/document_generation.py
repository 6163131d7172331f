"""Generation dispatch of the ``document_translation`` task
(:class:`DocumentGenerationMixin`): fairseq-interactive's documents across
calls, doc2doc segments under the sentence-count frame
(:mod:`ctx_fairseq.tasks.sentence_frame`), and one generator call per batch
for the concatenation baseline's forced prefixes, ``--own-target-context``
(sentences in document order, the model's own translations as target
context) and plain batches; the checks ``build_generator`` makes before
fairseq builds its generator."""

import logging
from typing import Dict, List, Optional

import numpy as np

import torch
from fairseq.data import LanguagePairDataset

from ctx_fairseq.data.concat_dataset import ConcatContextDataset, strip_prefix
from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.generation import (
    ForcedPrefixes,
    OwnTargetContextState,
    batch_device,
    best_tokens_on_cpu,
    to_device,
)
from ctx_fairseq.tasks.interactive import InteractiveDocumentState, InteractiveDocumentView
from ctx_fairseq.tasks.sentence_frame import (
    SentenceFrame,
    check_frame_generator,
    doc2doc_mode,
    frame_options,
)

logger = logging.getLogger(__name__)


class DocumentGenerationMixin:
    """How the document task generates (mixed into
    :class:`~ctx_fairseq.tasks.document_translation.DocumentTranslationTask`)."""

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """``fairseq-interactive``: the input lines are sentences of a document,
        in order; a blank line starts a new document. Context is kept across
        calls (buffers). doc2doc is refused: its segments are built from the
        whole document."""
        if doc2doc_mode(self.cfg) != "none":
            raise InputError("fairseq-interactive with --doc2doc is not supported: a segment is "
                             "built from the whole document (up to --doc2doc-max-tokens); "
                             "translate the binarized documents with fairseq-generate")
        c = self.context_spec
        if self.uses_context and (c.document_context == "offline" or (
                c.document_context == "none" and c.context_direction != "prev")):
            raise InputError(
                "fairseq-interactive reads a document line by line, so only context from "
                "previous sentences can be built (--context-direction prev or --document-context "
                "online); for following-sentence context translate the binarized document with "
                "fairseq-generate --task document_translation")
        if constraints is not None:
            raise InputError("--constraints is not supported with --task document_translation")
        if c.concat_context:
            raise InputError("fairseq-interactive with --concat-context is not supported yet: "
                             "translate the binarized documents with fairseq-generate")
        if self._interactive is None:
            keep = None if c.document_context == "online" else max(c.source_context_size,
                                                                     c.target_context_size)
            self._interactive = InteractiveDocumentState(keep)
        st = self._interactive
        st.trim()
        eos = self.source_dictionary.eos()
        sents, hyps = list(st.src), list(st.hyp)
        doc_ids = [f"doc{st.doc}"] * len(sents)
        line_to_full = []
        for t in src_tokens:
            t = torch.as_tensor(t).long()
            if t.numel() == 0 or (t.numel() == 1 and int(t[0]) == eos):  # blank: new document
                st.doc += 1
                st.src, st.hyp = [], []
                line_to_full.append(-1)
                continue
            line_to_full.append(len(sents))
            sents.append(t)
            hyps.append(None)
            doc_ids.append(f"doc{st.doc}")
            st.src.append(t)
            st.hyp.append(None)
        # full-dataset index -> position in the state's current document
        first = len(sents) - len(st.src)
        st.positions = {first + k: k for k in range(len(st.src))}
        if not sents:  # only blank lines
            return InteractiveDocumentView(None, np.full(len(line_to_full), -1))
        tgt_context = None
        if c.target_context_size > 0:
            empty = torch.tensor([self.target_dictionary.eos()], dtype=torch.long)
            tgt_context = [h if h is not None else empty for h in hyps]
        base = LanguagePairDataset(sents, np.array([len(x) for x in sents], dtype=np.int64),
                                   self.source_dictionary, tgt_dict=self.target_dictionary,
                                   shuffle=False)
        full = self.wrap(base, doc_ids, "<interactive input>", tgt_context)
        return InteractiveDocumentView(full, np.array(line_to_full, dtype=np.int64))

    def _restore_interactive_sample(self, sample):
        """fairseq-interactive passes only ``src_tokens``/``src_lengths``: take
        the batch it runs (the next expected one), collate it with context,
        check the source tokens, and use that ``net_input``."""
        st = self._interactive
        if st is None or not st.expected:
            raise InputError(
                "document_translation: a batch without its context inputs (no src_ctx_tokens / "
                "tgt_ctx_tokens) reached the model, which would translate it without context; "
                "build batches with the task's dataset (fairseq-generate / fairseq-interactive "
                "--task document_translation)")
        view, ids = st.expected.popleft()
        batch = view.collater([view[int(i)] for i in ids])
        given = sample["net_input"]["src_tokens"]
        if not torch.equal(batch["net_input"]["src_tokens"], given.cpu()):
            raise RuntimeError("document_translation: fairseq-interactive ran a batch other than "
                               "the one expected; cannot attach its context")
        moved = to_device({"net_input": batch["net_input"], "id": batch["id"]}, given.device)
        restored = dict(sample)
        restored["net_input"] = moved["net_input"]
        restored["id"] = moved["id"]
        restored["_view"] = view
        return restored

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """doc2doc with the sentence-count frame (``--doc2doc-frame``, or a
        model with ``always_frame``): one generator call under
        :class:`SentenceFrame`. fairseq's reference scorer
        (``--score-reference``) is left as it is."""
        opts = frame_options(self.cfg, models)
        if opts is None or type(generator).__name__ == "SequenceScorer":
            hypos = self._inference_step(generator, models, sample, prefix_tokens, constraints)
            doc2doc = getattr(getattr(self, "context_spec", None), "doc2doc", "none")
            if doc2doc != "none" and type(generator).__name__ != "SequenceScorer":
                self._count_cut_segments(generator, sample, hypos)
            return hypos
        if prefix_tokens is not None or constraints is not None:
            raise InputError("--prefix-size and --constraints cannot be combined with the "
                             "sentence-count frame")
        src_sep = self.source_dictionary.index(opts.separator)
        tgt_sep = self.target_dictionary.index(opts.separator)
        with SentenceFrame(generator, sample, src_sep, tgt_sep, opts,
                           src_pad=self.source_dictionary.pad(),
                           src_eos=self.source_dictionary.eos(),
                           describe=self._describe_segment) as frame:
            hypos = self._inference_step(generator, models, sample, None, None)
        self._count_at_maximum(frame, hypos, opts)
        return hypos

    def _running_totals(self, key: str, *counts: int) -> list:
        """Add this batch's ``counts`` to the process's running totals named
        ``key`` (for the generation warnings' "so far") and return them."""
        seen = self.__dict__.setdefault(key, [0] * len(counts))
        for k, c in enumerate(counts):
            seen[k] += c
        return seen

    def _count_at_maximum(self, frame, hypos, opts) -> None:
        """Under the frame: the sentences of the best hypotheses that reached
        their maximum ``max(floor(a * |x_i| + b), m)`` tokens (the frame ended
        them there), and the segments whose output reached the model's
        positions where those capped the frame; a batch with any is warned
        about, with the counts and the running totals of this process (one
        read of three numbers per batch, after the search)."""
        if not hypos:
            return
        reached, total, capped = (int(v) for v in frame.at_maximum(hypos).tolist())
        seen = self._running_totals("_sentences_at_maximum", reached, total, capped, len(hypos))
        if reached:
            logger.warning(
                f"sentence-count frame: {reached} of {total} sentences of this batch "
                f"({seen[0]} of {seen[1]} so far) reached their maximum length "
                f"max(floor(--doc2doc-max-len-a {opts.max_len_a} * source sentence length + "
                f"--doc2doc-max-len-b {opts.max_len_b}), --doc2doc-min-sentence-len "
                f"{opts.min_sentence_len}) and were ended there; raise -a/-b if these are cut "
                "translations")
        if capped:
            logger.warning(
                f"sentence-count frame: {capped} of {len(hypos)} segments of this batch "
                f"({seen[2]} of {seen[3]} so far) reached the model's maximum target positions "
                f"({frame.max_len} output tokens), so their sentences may have ended before "
                "their own maximum; lower --doc2doc-max-tokens (shorter segments) or use a "
                "model with more positions")

    def _count_cut_segments(self, generator, sample, hypos) -> None:
        """doc2doc without the frame: a segment whose best hypothesis reached
        the generator's maximum length (fairseq's ``--max-len-a`` /
        ``--max-len-b``, on the batch's longest source) was cut there; each
        batch with such segments is warned about, with the count and the
        running total (the split is then scored on cut translations)."""
        src_len = int(sample["net_input"]["src_tokens"].size(1))
        limit = min(int(generator.max_len_a * src_len + generator.max_len_b),
                    int(getattr(generator, "max_len", 1 << 30)) - 1)
        cut = sum(1 for h in hypos if h and int(h[0]["tokens"].numel()) > limit)
        seen = self._running_totals("_segments_cut", cut, len(hypos))
        if cut:
            logger.warning(
                f"doc2doc without the sentence-count frame: {cut} of {len(hypos)} segments of "
                f"this batch ({seen[0]} of {seen[1]} so far) reached the maximum output length "
                f"{limit} and are cut there; raise --max-len-a / --max-len-b, or use "
                "--doc2doc-frame")

    def _describe_segment(self, i: int) -> str:
        """Segment ``i`` of the generation split, for a message: its document
        and sentences (a doc2doc segment dataset), else its split."""
        split = getattr(self.cfg, "gen_subset", "test")
        ds = getattr(self, "datasets", {}).get(split)
        plan = getattr(ds, "plan", None)
        try:
            ids = ds.sentence_ids(i)
            return (f"{split}: document {ds.doc_names[plan.doc[i]]!r} of {ds.docids_path}, "
                    f"sentences {ids[0]}-{ids[-1]}")
        except (AttributeError, IndexError, TypeError):
            return split

    def _inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        if not self.uses_context:
            return super().inference_step(generator, models, sample, prefix_tokens, constraints)
        if self.cfg.own_target_context and "_view" not in sample:
            return self._own_target_context_step(generator, models, sample, prefix_tokens,
                                                 constraints)
        if self.context_spec.concat_context:
            return self._concat_step(generator, models, sample, prefix_tokens, constraints)
        ni = sample["net_input"]
        if not any(k in ni for k in self.context_keys()):
            sample = self._restore_interactive_sample(sample)
        view = sample.pop("_view", None)
        if view is None or self.context_spec.target_context_size <= 0:
            return super().inference_step(generator, models, sample, prefix_tokens, constraints)
        return self._sequential_step(view, generator, models, sample, prefix_tokens, constraints)

    def _concat_step(self, generator, models, sample, prefix_tokens, constraints,
                     plen: Optional[List[int]] = None):
        """Concatenation: the target context (with its breaks) is forced as
        the decoder's prefix and removed from the hypotheses; the whole batch
        in one call of the generator, whatever the rows' prefix lengths
        (:class:`ForcedPrefixes`)."""
        if "target_prefix_len" not in sample:
            raise ValueError("--concat-context: a batch without its concatenated context reached "
                             "the model; build batches with the task's dataset")
        if prefix_tokens is not None:
            raise InputError("--prefix-size is not supported with --concat-context (the target "
                             "context is the prefix)")
        if "target_prefix" not in sample:
            raise InputError("--concat-context: generation needs the target context as a prefix "
                             "(target_prefix: the generation split's dataset)")
        if plen is None:  # (given when the batch was collated here, still on the CPU)
            plen = sample["target_prefix_len"].tolist()  # one read per batch
        if max(plen, default=0) == 0:
            return super().inference_step(generator, models, sample, None, constraints)
        with ForcedPrefixes(generator, sample, plen):
            hypos = super().inference_step(generator, models, sample, None, constraints)
        for n, row in zip(plen, hypos):
            for h in row:
                if h["tokens"].numel() <= n:
                    raise RuntimeError(
                        f"--concat-context: a hypothesis ended inside its {n}-token target "
                        "context (the model's maximum target positions are too few for the "
                        "context and the translation)")
        return strip_prefix(hypos, plen, getattr(generator, "len_penalty", 1.0),
                            getattr(generator, "normalize_scores", True))

    def _own_target_context_step(self, generator, models, sample, prefix_tokens, constraints):
        """``--own-target-context``: the batch's sentences are translated
        position by position in their documents; after each position the best
        hypotheses become the target context of the next ones (re-collated
        from the dataset, so the context is built as in training). Linear in
        the document: each translation updates the context lengths of the
        sentences that read it only (``set_target_context``), and the check
        that the earlier sentences are translated reads one counter per
        document (:class:`OwnTargetContextState`)."""
        ds = self.datasets[self.cfg.gen_subset]
        inner = ds.inner if isinstance(ds, ConcatContextDataset) else ds
        if self._own_state is None or self._own_state.dataset is not inner:
            self._own_state = OwnTargetContextState(inner)
        state = self._own_state
        ids = np.asarray(sample["id"].tolist(), dtype=np.int64)
        pos = inner.sent_pos[ids]
        order = np.argsort(pos, kind="stable")
        cuts = np.flatnonzero(np.diff(pos[order])) + 1
        device = batch_device(sample)
        out: Dict[int, list] = {}
        for rows in np.split(order, cuts):
            group = ids[rows].tolist()
            for i in group:  # earlier sentences of its document must be translated already
                if not state.ready(i):
                    raise RuntimeError(
                        f"--own-target-context: sentence {i} comes before the translations of "
                        "the earlier sentences of its document; generate with the documents in "
                        "order (the task batches whole documents; do not use --num-shards or "
                        "--shard-id that split documents)")
            one = ds.collater([ds[i] for i in group])
            one_ids = one["id"].tolist()  # the collater's order (still on the CPU: no read)
            plen = one["target_prefix_len"].tolist() if self.context_spec.concat_context else None
            one = to_device(one, device)
            if self.context_spec.concat_context:
                hyps = self._concat_step(generator, models, one, None, None, plen)
            else:
                hyps = super().inference_step(generator, models, one, None, None)
            for i, h, best in zip(one_ids, hyps, best_tokens_on_cpu(hyps)):
                out[int(i)] = h
                ds.set_target_context(int(i), best)
                state.done(int(i))
        return [out[int(i)] for i in ids]

    def _sequential_step(self, view, generator, models, sample, prefix_tokens, constraints):
        """Interactive target context: translate the batch's sentences one at
        a time in document order, each re-collated on its own (context or
        document memory) after the model's translations of the previous
        sentences were put in place as their target side
        (``set_target_context``: the context lengths of the sentences that
        read it are updated, nothing else)."""
        st, full = self._interactive, view.full
        device = batch_device(sample)
        lines = [int(i) for i in sample["id"].tolist()]
        rows = sorted(range(len(lines)), key=lambda r: int(view.line_to_full[lines[r]]))
        out = [None] * len(lines)
        for r in rows:
            f = int(view.line_to_full[lines[r]])
            one = to_device(view.collater([view[lines[r]]]), device)
            hyp = super().inference_step(
                generator, models, one,
                prefix_tokens[r:r + 1] if prefix_tokens is not None else None,
                constraints[r:r + 1] if constraints is not None else None)[0]
            out[r] = hyp
            best = hyp[0]["tokens"].detach().long().cpu()
            full.set_target_context(f, best)
            k = st.positions.get(f)
            if k is not None and k < len(st.hyp):
                st.hyp[k] = best
        return out

    def build_generator(self, models, args, **kwargs):
        opts = frame_options(self.cfg, models)  # (--doc2doc-frame without --doc2doc: an error)
        spec = getattr(self, "context_spec", None)  # (a stand-in task in the frame's tests)
        longest = int(getattr(spec, "doc2doc_max_tokens", 0) or 0)
        if (opts is None and getattr(spec, "doc2doc", "none") != "none"
                and not getattr(args, "score_reference", False)
                and float(getattr(args, "max_len_a", 0) or 0) * longest
                + int(getattr(args, "max_len_b", 200)) < longest):
            raise InputError(
                f"doc2doc without the sentence-count frame: --max-len-a "
                f"{getattr(args, 'max_len_a', 0)} --max-len-b {getattr(args, 'max_len_b', 200)} "
                f"would cut the translation of a segment of --doc2doc-max-tokens {longest} "
                f"(fairseq's default caps every output at 200 tokens); give e.g. --max-len-a 1.5 "
                "--max-len-b 10, or --doc2doc-frame")
        if opts is not None and not getattr(args, "score_reference", False):
            check_frame_generator(args)
            for name, d in (("source", self.source_dictionary), ("target",
                                                                 self.target_dictionary)):
                if d.index(opts.separator) == d.unk():
                    raise InputError(f"the sentence-count frame: the separator "
                                     f"{opts.separator!r} is not in the {name} dictionary")
        # fairseq-generate loads its split first; fairseq-interactive loads none and
        # takes target context from the model's own translations
        if (self.context_spec.target_context_size > 0 and not self.cfg.gold_target_context
                and not self.cfg.target_context_file and not self.cfg.own_target_context
                and self.datasets):
            raise InputError("generation with --target-context-size > 0 needs the target "
                             "context: --gold-target-context (references), "
                             "--target-context-file FILE (hypotheses of an earlier pass) or "
                             "--own-target-context (the model's own translations, in document "
                             "order)")
        if self.context_spec.concat_context and getattr(args, "score_reference", False):
            raise InputError("--score-reference with --concat-context is not supported (fairseq's "
                             "reference scorer knows nothing of the target context); score "
                             "references with ctx-score-contrastive or a validation pass")
        if self.context_spec.concat_context:  # the break only ever comes from the forced prefix
            extra = dict(kwargs.get("extra_gen_cls_kwargs") or {})
            extra["tokens_to_suppress"] = list(extra.get("tokens_to_suppress", ())) + [
                self.context_spec.concat_break]
            kwargs["extra_gen_cls_kwargs"] = extra
        return super().build_generator(models, args, **kwargs)
