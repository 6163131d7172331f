"""The dataset assembly of the ``document_translation`` task
(:class:`DocumentDatasetsMixin`): a split's sentence pairs and ``.docids``
read, wrapped in a :class:`~ctx_fairseq.data.document_dataset.DocumentContextDataset`
built from the task's context specification (a split's role, a scorer's
condition), the checkpoint's context options checked, and the truncation of
long contexts logged once per split."""

import dataclasses
import logging
import os
from typing import List, Optional, Sequence

import numpy as np

import torch
from fairseq import utils

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.data.concat_dataset import ConcatContextDataset, concat_limits
from ctx_fairseq.data.document_dataset import DocumentContextDataset
from ctx_fairseq.data.docids import read_docids
from ctx_fairseq.data.segment_dataset import SegmentDataset, check_positions, find_symbol
from ctx_fairseq.data.segments import document_starts, plan_segments
from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.context_options import (
    context_option_diff,
)

logger = logging.getLogger(__name__)


def _symbol_index(dictionary, symbol: str, which: str) -> int:
    idx = dictionary.index(symbol)
    if idx == dictionary.unk() and symbol != dictionary.unk_word:
        raise InputError(f"--context-separator {symbol!r} is not in the {which} dictionary; "
                         "use a symbol of the dictionary (default </s>)")
    return idx


def read_target_context_file(path: str, dictionary, expected: int) -> List[torch.Tensor]:
    """Hypotheses of an earlier pass, one per line in corpus order."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except OSError as err:
        raise InputError(f"--target-context-file {path}: cannot read it ({err.strerror or err})") \
            from err
    if len(lines) != expected:
        raise InputError(f"--target-context-file {path}: {len(lines)} lines for {expected} "
                         "sentences; expected one hypothesis per sentence, in corpus order")
    return [dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()
            for line in lines]


class DocumentDatasetsMixin:
    """How the document task builds its datasets (mixed into
    :class:`~ctx_fairseq.tasks.document_translation.DocumentTranslationTask`)."""

    def _data_path(self, split: str, epoch: int) -> str:
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        return paths[(epoch - 1) % len(paths)]

    def _separator(self) -> int:
        if self.context_spec.concat_context:
            return self.src_dict.index(self.context_spec.concat_break)
        sep = _symbol_index(self.src_dict, self.cfg.context_separator, "source")
        if self.context_spec.target_context_size > 0:
            tsep = _symbol_index(self.tgt_dict, self.cfg.context_separator, "target")
            if tsep != sep:
                raise InputError(f"--context-separator {self.cfg.context_separator!r} has "
                                 "different indices in the source and target dictionaries")
        return sep

    def wrap(self, base, doc_ids: Sequence[str], docids_path: str,
             tgt_context: Optional[Sequence] = None, generation: bool = False,
             training: bool = False, condition: Optional[ContextCondition] = None):
        """The split's dataset with context: a ``DocumentContextDataset``, or
        with ``--concat-context`` a ``ConcatContextDataset`` over one
        (``generation``: targets without their context, which becomes the
        decoder's prefix; ``training``: the split fairseq-train trains on,
        the only one with ``--context-dropout`` / ``--coword-dropout`` /
        ``--sampled-context-size``; ``condition``: the context a scorer asks
        for, :class:`~ctx_fairseq.data.conditions.ContextCondition`, in place
        of ``--context-ablation``; see :meth:`condition_dataset`)."""
        c = self.cfg
        spec = self.context_spec
        if condition is not None:
            spec = condition.apply(spec)
        spec = spec.for_split(training)
        if generation and c.own_target_context:
            spec = dataclasses.replace(spec, document_batching=True)
        limits = {"src": c.max_source_positions, "tgt": c.max_target_positions}
        if spec.concat_context:
            limits = concat_limits(base, c.max_source_positions, c.max_target_positions,
                                   generation)
        inner = DocumentContextDataset(
            base, doc_ids, spec, separator=self._separator(), tgt_context=tgt_context,
            max_context_tokens=limits, docids_path=docids_path,
            context_layout=None if spec.concat_context else self.context_layout)
        if spec.concat_context:
            return ConcatContextDataset(inner, self._separator(), generation=generation)
        return inner

    def condition_dataset(self, split: str, condition: ContextCondition):
        """Split ``split`` (loaded if it is not) under a context condition:
        ``true``, ``none``, a size N, ``shuffled`` or ``random``
        (:mod:`ctx_fairseq.data.conditions`), built as scoring builds a split
        (no dropout, targets with their context, target context from the
        references). The one way ctx-cxmi (and any scorer) gets a condition:
        the task's options are left as they are."""
        if self.cfg.target_context_file or self.cfg.own_target_context:
            raise InputError("a context condition takes the target context from the "
                             "references; --target-context-file / --own-target-context would "
                             "be replaced by them: leave them out to score conditions")
        if split not in self.datasets:
            self.load_dataset(split)
        ds = getattr(self.datasets[split], "inner", self.datasets[split])
        return self.wrap(ds.base, ds.doc_ids, ds.docids_path, condition=condition)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        tgt_file = self.cfg.target_context_file
        if tgt_file and (split != self.cfg.gen_subset or split == self.cfg.train_subset):
            raise InputError(
                f"--target-context-file {tgt_file} is for generation only (it applies to "
                f"--gen-subset {self.cfg.gen_subset}), but split {split!r} is being loaded; "
                "training and validation take target context from the references")
        if tgt_file and self.cfg.gold_target_context:
            raise InputError("--gold-target-context and --target-context-file both given; "
                             "choose one source of target context")
        if tgt_file and self.context_spec.target_context_size <= 0:
            raise InputError(f"--target-context-file {tgt_file} given, but "
                             "--target-context-size is 0: the file would not be used")
        generating = kwargs.get("task_cfg") is not None  # fairseq-generate
        if generating:  # the checkpoint's task
            self.check_context_options(kwargs["task_cfg"])
        if self.cfg.own_target_context:
            if not generating or split != self.cfg.gen_subset:
                raise InputError("--own-target-context is for fairseq-generate (the model's own "
                                 "translations as target context); training and validation take "
                                 "target context from the references")
            if self.context_spec.target_context_size <= 0:
                raise InputError("--own-target-context given, but --target-context-size is 0")
            if tgt_file or self.cfg.gold_target_context:
                raise InputError("--own-target-context, --gold-target-context and "
                                 "--target-context-file: choose one source of target context")
            if self.context_spec.document_context == "offline" or (
                    self.context_spec.document_context == "none" and self.context_spec.context_direction != "prev"):
                raise InputError("--own-target-context: the model's own translations exist for "
                                 "previous sentences only (--context-direction prev or "
                                 "--document-context online); following sentences would get "
                                 "empty target context")
            if self.context_spec.ablation != "none":
                raise InputError("--own-target-context with --context-ablation: the wrong "
                                 "context would come from documents not translated yet; "
                                 "translate once, then use --target-context-file with the "
                                 "ablation")
        try:
            super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        except FileNotFoundError as err:  # fairseq's "Dataset not found: SPLIT (DIR)"
            raise InputError(
                f"split {split!r} not found in {self._data_path(split, epoch)}: expected "
                f"{split}.{self.cfg.source_lang}-{self.cfg.target_lang}.{{bin,idx}} of each "
                f"language (fairseq-preprocess writes them); check --train-subset / "
                f"--valid-subset / --gen-subset ({err})") from err
        base = self.datasets[split]
        path = os.path.join(self._data_path(split, epoch), f"{split}.docids")
        doc_ids = read_docids(path, expected=len(base))
        if self.context_spec.doc2doc != "none":
            self._load_segments(split, epoch, base, doc_ids, path, generating)
            return
        tgt_context = None
        if self.context_spec.target_context_size > 0 and tgt_file:
            tgt_context = read_target_context_file(tgt_file, self.tgt_dict, len(base))
        if self.cfg.own_target_context:  # filled in document order as sentences are translated
            empty = torch.tensor([self.tgt_dict.eos()], dtype=torch.long)
            tgt_context = [empty] * len(base)
        # context / CoWord dropout: only the split fairseq-train's trainer loads to train on
        # (it passes data_selector); validation, generation and scoring tools never get it
        training = (split == self.cfg.train_subset and not generating
                    and "data_selector" in kwargs)
        self.datasets[split] = self.wrap(base, doc_ids, path, tgt_context, generation=generating,
                                         training=training)
        ds = self.datasets[split]
        logger.info(f"{split}: {len(ds)} sentences in {len(ds.doc_start)} documents "
                    f"({path}); source context {self.context_spec.source_context_size}, target context "
                    f"{self.context_spec.target_context_size}, direction {self.context_spec.context_direction}, "
                    f"document context {self.context_spec.document_context}, ablation "
                    f"{self.context_spec.ablation}")
        spec = self.context_spec
        if training and (spec.context_dropout or spec.coword_dropout
                         or spec.sampled_context_size):
            logger.info(f"{split}: context dropout {spec.context_dropout}, CoWord dropout "
                        f"{spec.coword_dropout}, sampled context size 0.."
                        f"{spec.sampled_context_size} (drawn per sentence and epoch from --seed "
                        f"{spec.seed}; this split only)")
        self._log_truncation(split, ds)

    def _load_segments(self, split: str, epoch: int, base, doc_ids: Sequence[str], path: str,
                       generating: bool) -> None:
        """``--doc2doc``: the split as segments
        (:class:`~ctx_fairseq.data.segment_dataset.SegmentDataset`), planned in
        the training mode for the split fairseq-train trains on and greedily
        for every other (validation, generation); the plan's summary logged,
        a segment over the positions and the separator inside the text
        refused (one line each)."""
        c = self.cfg
        training = split == c.train_subset and not generating
        mode = c.doc2doc if training else "greedy"
        sep = c.doc2doc_separator
        prefix = os.path.join(self._data_path(split, epoch),
                              f"{split}.{c.source_lang}-{c.target_lang}")
        for side, data, lang in (("src", base.src, c.source_lang),
                                 ("tgt", base.tgt, c.target_lang)):
            if data is None or not self._separator_in_data.get(side):
                continue  # added by the task: no binarized token has its index
            d = self.src_dict if side == "src" else self.tgt_dict
            line = find_symbol(data, d.index(sep))
            if line is not None:
                raise InputError(
                    f"{prefix}.{lang}: sentence {line} (line {line + 1}, document "
                    f"{doc_ids[line]!r}) contains the separator {sep!r}: the segments could "
                    "not be split back into sentences; choose another --doc2doc-separator "
                    "or remove the symbol from the text")
        plan = plan_segments(base.src_sizes, base.tgt_sizes, doc_ids, mode,
                             c.doc2doc_max_tokens)
        names = [doc_ids[int(i)] for i in document_starts(doc_ids)[:-1]] if len(doc_ids) else []
        ds = SegmentDataset(base, plan, self.src_dict.index(sep), self.tgt_dict.index(sep),
                            names, path)
        check_positions(ds, c.max_source_positions, c.max_target_positions, split)
        self._warn_empty_sentences(split, base, doc_ids, prefix)
        self.datasets[split] = ds
        logger.info(f"{split}: --doc2doc {c.doc2doc} ({mode} on this split): {plan.describe()} "
                    f"({path})")

    def _warn_empty_sentences(self, split: str, base, doc_ids: Sequence[str],
                              prefix: str) -> None:
        """A sentence empty on one side only (``</s>`` alone opposite a
        non-empty one): the binaries keep the sides line-aligned (fairseq
        checks their counts; one document id per line), so this is the one
        way a document's sentences can differ between the sides. It is
        kept (a segment then holds two separators in a row), and counted."""
        if base.tgt_sizes is None:
            return
        src, tgt = np.asarray(base.src_sizes), np.asarray(base.tgt_sizes)
        one_side = np.flatnonzero((src <= 1) != (tgt <= 1))
        if len(one_side):
            i = int(one_side[0])
            logger.warning(
                f"{split}: {len(one_side)} sentence(s) empty on one side only (first: line "
                f"{i + 1} of {prefix}.*, document {doc_ids[i]!r}); a misaligned document? "
                "Kept: the segment has an empty sentence there")

    def check_context_options(self, trained) -> None:
        """A model is translated with the context it was trained with: options
        that differ from the checkpoint's task are an error (unless
        ``--allow-context-change``; ``--context-ablation`` is the way to give
        wrong context on purpose)."""
        get = trained.get if hasattr(trained, "get") else lambda k, d=None: getattr(trained, k, d)
        ours = self.context_spec.doc2doc
        if ours != "none" and (get("_name", None) != "document_translation"
                               or str(get("doc2doc", "none") or "none") == "none"):
            raise InputError(
                f"--doc2doc {ours}: the checkpoint was trained on sentences (task "
                f"{get('_name', None)!r}, no --doc2doc): it has no trained separator "
                f"{self.cfg.doc2doc_separator!r}; fine-tune it on segments first "
                "(fairseq-train --doc2doc ... --finetune-from-model CHECKPOINT)")
        if get("_name", None) not in (None, "document_translation"):
            return
        diff = context_option_diff(trained, self.cfg)
        if not diff:
            return
        if self.cfg.allow_context_change:
            logger.warning("context options differ from the checkpoint's: " + "; ".join(diff))
            return
        raise InputError("context options differ from those the checkpoint was trained with: "
                         + "; ".join(diff) + ". Give the checkpoint's options (or "
                         "--allow-context-change for an experiment; --context-ablation for "
                         "wrong context on purpose)")

    def _log_truncation(self, split: str, ds: DocumentContextDataset) -> None:
        """Once per split: how many context tokens the length limit cut."""
        if split in self._truncation_logged:
            return
        self._truncation_logged.add(split)
        for side, (sentences, cut, total) in ds.truncation.items():
            name = "source" if side == "src" else "target"
            limit = ds.max_context_tokens[side]
            if limit is not None and np.ndim(limit):
                limit = "the room each sentence leaves (concatenation)"
            if cut:
                logger.warning(
                    f"{split}: {name} context longer than {limit} tokens for {sentences} of "
                    f"{len(ds)} sentences; kept the sentences nearest each one, cut {cut} of "
                    f"{total} context tokens ({100.0 * cut / max(total, 1):.1f}%)")
            else:
                logger.info(f"{split}: no {name} context cut ({total} context tokens, "
                            f"limit {limit} per sentence)")
