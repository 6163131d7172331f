"""``document_translation``: sentence-level translation with document context.

Extends fairseq's ``translation`` task. Besides the binarized data it reads
``{data}/{split}.docids`` (one document id per sentence, documents
contiguous; ``ctx-make-toy`` and ``ctx-prep-docs`` write it) and wraps each
split in :class:`ctx_fairseq.data.document_dataset.DocumentContextDataset`,
which adds the context sentences to ``net_input`` (``src_ctx_tokens``,
``src_ctx_lengths``, ``tgt_ctx_tokens``, ``tgt_ctx_lengths``). See
``docs/document_translation.md``.

The task in four modules: its options (``tasks/document_config.py``), the
context specification it builds once from them (``task.context_spec``,
:class:`~ctx_fairseq.data.contract.ContextSpec`), its dataset assembly
(``tasks/document_datasets.py``) and its generation dispatch
(``tasks/document_generation.py``); this module holds the task itself
(model negotiation, batch iterators, checkpoints).

Options (besides those of ``translation``):

``--source-context-size N`` / ``--target-context-size N``
    context sentences per direction (default 1 / 0; 0 turns a side off).
``--context-direction prev|next|both``
    previous, following or both (default prev).
``--context-ablation none|shuffled|random``
    Voita et al.'s check that a model uses real context: context of another,
    random document position, or random tokens (deterministic for ``--seed``).
    With ``--document-memory``: another document's memory, or memory
    sentences of random tokens.
``--sampled-context-size K``
    training only (Fernandes et al. 2021; contextual-mt's option of that
    name): per sentence and epoch only its ``k`` nearest previous context
    sentences are kept, ``k`` uniform on ``0..K``, one draw for both sides
    (:meth:`DocumentContextDataset.context_cap`), so that the empty context
    of CXMI and every size up to ``K`` are in distribution. With a document
    memory, a window drawn from ``0..K``.
``--memory-window K``
    outside training, a document memory's window (default: the sampled
    ``K``, else the whole memory). ``--sample-context-size K`` is the
    deprecated name of both (``tasks/context_options.py``).
``--context-dropout P`` / ``--coword-dropout P``
    training only. Context dropout (this repository's option; the same as the
    sampled size only for one context sentence and ``P = 0.5``): each
    sentence's whole context is
    dropped with probability ``P`` (it gets the empty context of a
    document's first sentence; with ``--document-memory`` it sees no memory
    sentence), so one model serves with and without context. CoWord dropout
    (Fernandes et al. 2021, Sec. 5, who replace by ``<mask>``): each token (BPE
    unit) of the current source sentence is replaced by ``<unk>`` with probability
    ``P`` (never ``</s>``). Drawn per sentence and epoch from the seed
    (:meth:`DocumentContextDataset.dropout_draws`), reproducible and
    independent of batching; only the split fairseq-train trains on gets
    them (validation, generation, ``ctx-cxmi`` and the scorers never do);
    ``--max-tokens`` counts the undropped context (dropping only shrinks a
    batch).
``--document-context none|online|offline``
    whole-document context for document-level models: every previous sentence
    (online) or every other sentence (offline) of the document; implies
    ``--document-batching``.
``--document-batching``
    batches of whole documents (or consecutive chunks of a document too large
    for ``--max-tokens``). Distributed workers get fairseq's round-robin
    shards of the shuffled batches (the batches of an update depend on the
    seed and epoch only, not on the number of workers); generation with
    ``--own-target-context`` and ``--num-shards`` keeps documents whole per
    shard (:class:`~ctx_fairseq.data.batching.DocumentShardedEpochBatchIterator`).
``--context-separator SYMBOL``
    token that ends each context sentence (default ``</s>``); must be in the
    dictionaries.
``--gold-target-context`` / ``--target-context-file FILE``
    at generation time, target context from the references or from a file of
    hypotheses of an earlier pass (one line per sentence, corpus order);
    ``fairseq-generate`` with ``--target-context-size > 0`` needs one of them.
    The file applies to the generation split (``--gen-subset``) only: loading
    any other split with it is an error (training and validation take target
    context from the references).

``--concat-context``
    the concatenation baseline (Tiedemann and Scherrer 2017) for any
    sentence-level architecture: the previous ``--source-context-size``
    sentences are prepended to the source, ``--target-context-size`` previous
    target sentences to the target ("2-to-2"; 0: "2-to-1"), each ended by
    ``--concat-break`` (default ``<brk>``, added to both dictionaries when
    missing). At generation the target context is forced as the decoder's
    prefix and removed from the output; ``--concat-context-loss-weight W``
    weights the loss of the target context tokens (with the criterion
    ``label_smoothed_cross_entropy_ctx``). See
    :mod:`ctx_fairseq.data.concat_dataset` and ``docs/concatenation.md``.
``--doc2doc greedy|multires``
    documents translated as segments of consecutive sentences, for any
    sentence-level architecture (no context inputs: needs
    ``--source-context-size 0``): ``x_1 <sep> ... x_n </s>`` on both sides,
    planned from the sentence binaries' sizes and ``.docids``
    (:mod:`ctx_fairseq.data.segments`, :class:`~ctx_fairseq.data.segment_dataset.SegmentDataset`):
    greedy segments of at most ``--doc2doc-max-tokens`` (Junczys-Dowmunt
    2019), or for the training split multi-resolution chunks (Sun et al.
    2022; other splits greedy). ``--doc2doc-separator`` (default ``<sep>``)
    is added to both dictionaries; a sentence checkpoint made without it
    loads (``--finetune-from-model``): its embedding and output-projection
    rows are extended on load (:class:`~ctx_fairseq.data.vocabulary_rows.VocabularyExtension`).
    ``ctx-doc2doc-split`` maps the segments' output back to sentences. See
    ``docs/doc2doc.md``.
``--own-target-context``
    generation with target context: the model's own translations of the
    previous sentences, in document order (documents are batched whole and
    each batch is translated position by position, linear in the document),
    instead of ``--gold-target-context`` / ``--target-context-file``;
    previous-sentence context only.

Batch sizes count the context tokens (see
:class:`~ctx_fairseq.data.document_dataset.DocumentContextDataset`):
``--max-tokens`` bounds the padded source + source context (and target +
target context) tensors of every batch, the context counted as the model lays
it out (its ``context_layout``, read when the task builds the model and set
on every split: :func:`ctx_fairseq.data.contract.model_contract`). Contexts longer than
``--max-source-positions`` / ``--max-target-positions`` keep the sentences
nearest the current one; how many tokens were cut is logged once per split.

``fairseq-interactive``: the input is read as documents, one sentence per
line, a blank line starting a new document (and printing nothing). Context
is kept across ``--buffer-size`` buffers; only previous-sentence context can
be built line by line (``--context-direction prev`` or ``--document-context
online``; anything else is an error). Target context is the model's own
translations of the previous sentences of the document. fairseq-interactive
hands the task only the source tokens of a batch; :meth:`inference_step`
restores the batch's context inputs from the task's dataset (and checks that
the source tokens are the ones expected) instead of letting the model run
without context.

Batches the task builds at generation (``--own-target-context``'s positions,
fairseq-interactive's restored context) are moved whole to the device of the
batch fairseq handed it (:func:`to_device`); ``--concat-context`` generates a
batch in one generator call whatever its prefix lengths
(:class:`ForcedPrefixes`).

Two-stage training: ``--init-from-sentence-checkpoint`` is read when the model
is built for a new run only; when fairseq will restore a checkpoint
(``checkpoint_last.pt`` in ``--save-dir``, ``--restore-file``,
``--finetune-from-model``), the initialisation is skipped and not re-read.
"""

import logging
import os
from collections import deque
from typing import Dict, List, Optional, Sequence

import numpy as np

import torch
from fairseq.data import data_utils
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationTask

from ctx_fairseq.data.concat_dataset import ConcatContextDataset
from ctx_fairseq.data.contract import ContextSpec, model_contract
from ctx_fairseq.data.document_dataset import DocumentContextDataset
from ctx_fairseq.data.segment_dataset import SegmentDataset, check_segments_fit_batches
from ctx_fairseq.data.batching import DocumentShardedEpochBatchIterator, document_groups
from ctx_fairseq.data.layouts import merge_context_layouts, normalise_context_layout
from ctx_fairseq.errors import InputError
from ctx_fairseq.data.vocabulary_rows import VocabularyExtension
from ctx_fairseq.tasks.context_options import validate_context_options
from ctx_fairseq.tasks.generation import (
    OwnTargetContextState,
)
from ctx_fairseq.tasks.interactive import InteractiveDocumentState, InteractiveDocumentView
from ctx_fairseq.tasks.document_config import CONTEXT_OPTIONS, DocumentTranslationConfig
from ctx_fairseq.tasks.document_datasets import DocumentDatasetsMixin
from ctx_fairseq.tasks.document_generation import DocumentGenerationMixin

logger = logging.getLogger(__name__)


@register_task("document_translation", dataclass=DocumentTranslationConfig)
class DocumentTranslationTask(DocumentDatasetsMixin, DocumentGenerationMixin, TranslationTask):
    """Translation with document structure and context sentences in
    ``net_input`` (see the module docstring)."""

    cfg: DocumentTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        #: the dictionaries' sizes before the task adds its symbols (--concat-break,
        #: --doc2doc-separator): a sentence checkpoint's rows, extended on load
        #: (build_model); and per side whether the separator was in the data's
        #: dictionary already
        self._vocab_before = {"src": len(src_dict), "tgt": len(tgt_dict)}
        if cfg.concat_context:  # before the model is built: the vocabulary includes it
            for d in (src_dict, tgt_dict):
                if d.index(cfg.concat_break) == d.unk() and cfg.concat_break != d.unk_word:
                    d.add_symbol(cfg.concat_break)
        self._separator_in_data = {}
        if getattr(cfg, "doc2doc", "none") not in (None, "none"):
            sep = cfg.doc2doc_separator
            for side, d in (("src", src_dict), ("tgt", tgt_dict)):
                present = d.index(sep) != d.unk() or sep == d.unk_word
                self._separator_in_data[side] = present
                if not present:
                    d.add_symbol(sep)
        super().__init__(cfg, src_dict, tgt_dict)
        self._interactive: Optional[InteractiveDocumentState] = None
        self._truncation_logged = set()
        self._own_state: Optional[OwnTargetContextState] = None
        #: the context layout of the models built (``set_context_layout``)
        self.context_layout: Dict[str, str] = normalise_context_layout(None)
        self._check_options()  # (bad options raise InputError: one line, errors.py)
        #: the one context specification, built once from the options: what
        #: the datasets, the models' builders, generation and the tools read
        self.context_spec = ContextSpec.from_task_config(self.cfg, self.src_dict)

    def _check_options(self) -> None:
        """The task's options, checked before any data is read: the declared
        checks (:func:`~ctx_fairseq.tasks.context_options.validate_context_options`)
        and ``--concat-break``'s index in both dictionaries."""
        c = self.cfg
        validate_context_options(c)
        if c.concat_context and c.target_context_size > 0 and \
                self.src_dict.index(c.concat_break) != self.tgt_dict.index(c.concat_break):
            raise InputError(f"--concat-break {c.concat_break!r} has different indices in the "
                             "source and target dictionaries")

    @property
    def uses_context(self) -> bool:
        return self.context_spec.uses_context

    def context_keys(self) -> List[str]:
        """The ``net_input`` keys this task's batches carry context in."""
        if self.context_spec.concat_context:
            return ["src_tokens"]  # the context is inside the sequences
        if self.context_spec.document_memory:
            return ["mem_src_tokens"]
        keys = []
        if self.context_spec.source_context_size > 0:
            keys.append("src_ctx_tokens")
        if self.context_spec.target_context_size > 0:
            keys.append("tgt_ctx_tokens")
        return keys

    #: options that change what a model sees, compared with the checkpoint's
    CONTEXT_OPTIONS = CONTEXT_OPTIONS

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None,
                           max_positions=None, ignore_invalid_inputs=False,
                           required_batch_size_multiple=1, seed=1, num_shards=1, shard_id=0,
                           num_workers=0, epoch=1, data_buffer_size=0,
                           disable_iterator_cache=False, skip_remainder_batch=False,
                           grouped_shuffling=False, update_epoch_batch_itr=False):
        if isinstance(dataset, InteractiveDocumentView):
            # fairseq-interactive: remember the batches in the order they will run
            itr = super().get_batch_iterator(
                dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                max_positions=max_positions, ignore_invalid_inputs=ignore_invalid_inputs,
                required_batch_size_multiple=required_batch_size_multiple, seed=seed,
                num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
                data_buffer_size=data_buffer_size, disable_iterator_cache=True)
            self._interactive.expected = deque(
                (dataset, np.asarray(b, dtype=np.int64)) for b in itr.frozen_batches if len(b))
            return itr
        if isinstance(dataset, SegmentDataset):
            check_segments_fit_batches(dataset, max_tokens,
                                       skip_invalid=bool(ignore_invalid_inputs
                                                         and max_positions is not None))
        # fairseq deals the shuffled batches round-robin, so that the batches of an
        # update depend on (seed, epoch) only: N workers run the micro-batches one
        # process with --update-freq N runs. Every batch carries its own context (or
        # document memory), so a document's chunks may run on different workers. Only
        # --own-target-context needs its documents whole on one worker, translated in
        # order (a sentence's target context is the model's output for the one before).
        # (the concatenation baseline's dataset wraps the document dataset)
        docs = getattr(dataset, "inner", dataset)
        doc_sharding = (isinstance(docs, DocumentContextDataset) and docs.document_batching
                        and num_shards > 1 and bool(getattr(self.cfg, "own_target_context",
                                                            False)))
        if not doc_sharding:
            itr = super().get_batch_iterator(
                dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                max_positions=max_positions, ignore_invalid_inputs=ignore_invalid_inputs,
                required_batch_size_multiple=required_batch_size_multiple, seed=seed,
                num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
                data_buffer_size=data_buffer_size, disable_iterator_cache=disable_iterator_cache,
                skip_remainder_batch=skip_remainder_batch, grouped_shuffling=grouped_shuffling,
                update_epoch_batch_itr=update_epoch_batch_itr)
            if num_shards > 1 and not callable(getattr(itr, "batch_sampler", None)):
                self._warn_if_idle(dataset, len(itr.frozen_batches), "batches", num_shards,
                                   shard_id, shard_id < len(itr.frozen_batches))
            return itr
        # --own-target-context: whole documents per shard, the batches fairseq makes,
        # dealt by document
        reuse = (not disable_iterator_cache and not update_epoch_batch_itr
                 and self.can_reuse_epoch_itr(dataset))
        if reuse and dataset in self.dataset_to_epoch_iter:
            return self.dataset_to_epoch_iter[dataset]
        dataset.set_epoch(epoch)
        with data_utils.numpy_seed(seed + epoch):
            indices = dataset.ordered_indices()
        if max_positions is not None:
            indices = self.filter_indices_by_size(indices, dataset, max_positions,
                                                  ignore_invalid_inputs)
        batches = dataset.batch_by_size(indices, max_tokens=max_tokens,
                                        max_sentences=max_sentences,
                                        required_batch_size_multiple=required_batch_size_multiple)
        epoch_iter = DocumentShardedEpochBatchIterator(
            dataset, dataset.collater, batches, docs.doc_index, seed=seed,
            num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
            buffer_size=data_buffer_size, skip_remainder_batch=skip_remainder_batch,
            grouped_shuffling=grouped_shuffling,
            reuse_dataloader=getattr(self.cfg, "reuse_dataloader", True),
            persistent_workers=getattr(self.cfg, "persistent_workers", True))
        if reuse:
            self.dataset_to_epoch_iter[dataset] = epoch_iter
        groups = len(document_groups(epoch_iter.frozen_batches, docs.doc_index))
        self._warn_if_idle(dataset, groups, "document groups", num_shards, shard_id,
                           bool(epoch_iter.shard_batches()))
        return epoch_iter

    def _warn_if_idle(self, dataset, count: int, what: str, num_shards: int, shard_id: int,
                      has_batches: bool) -> None:
        """Warn (once per split and worker) when this worker gets no batch of
        ``dataset``: it would run padding batches only."""
        warned = self.__dict__.setdefault("_idle_warned", set())
        key = (id(dataset), num_shards, shard_id)
        if has_batches or key in warned:
            return
        warned.add(key)
        logger.warning(
            "worker %d of %d gets no batch: %d %s for %d workers, so it runs empty or padding "
            "batches only (in training it contributes no gradient, in validation no sentence); "
            "use fewer workers or smaller batches "
            "(--max-tokens / --batch-size, --max-tokens-valid / --batch-size-valid)", shard_id,
            num_shards, count, what, num_shards)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        # a sentence checkpoint made without the symbols the task added (--doc2doc's
        # separator): its embedding / output-projection rows extended on load, when a
        # new run starts from it (--finetune-from-model); restored to translate or score
        # (from_checkpoint), such a checkpoint is refused (a random row would be read)
        VocabularyExtension.register(model, self._vocab_before,
                                     {"src": len(self.src_dict), "tgt": len(self.tgt_dict)},
                                     seed=getattr(self.cfg, "seed", 1), refuse=from_checkpoint)
        contract = model_contract(model)
        arch = getattr(cfg, "arch", type(model).__name__)
        if self.context_spec.doc2doc != "none" and contract.inputs:
            raise InputError(f"--doc2doc translates segments with a sentence-level architecture "
                             f"(or transformer_gtrans); {arch} reads context inputs of its own "
                             f"({', '.join(sorted(contract.inputs))})")
        if self.context_spec.concat_context:
            if hasattr(model, "finish_setup") or contract.inputs:
                raise InputError("--concat-context is for sentence-level architectures; "
                                 f"{arch} reads context inputs of its own")
        elif self.context_spec.source_context_size > 0 or self.context_spec.target_context_size > 0:
            if not contract.inputs:  # a context model's unread side: warned below
                raise InputError(
                    f"--arch {arch} does not take document context (its forward has no "
                    f"{self.context_keys()[0]}: its class declares no context_contract); use a "
                    "context-aware architecture or --source-context-size 0 "
                    "--target-context-size 0")
        if not self.context_spec.concat_context:
            self.set_context_layout(contract.layout)
        path = getattr(cfg, "init_from_sentence_checkpoint", None)
        restore = None if from_checkpoint else self.checkpoint_to_restore()
        if path and restore:
            logger.info(f"--init-from-sentence-checkpoint {path} not read: the run restores "
                        f"{restore}, which already holds the initialised model")
        init = path if (path and not from_checkpoint and not restore) else None
        if hasattr(model, "finish_setup"):
            model.finish_setup(init, new_run=not from_checkpoint and not restore)
        elif init and hasattr(model, "load_sentence_checkpoint"):
            model.load_sentence_checkpoint(init)
        if (self.context_spec.target_context_size > 0 and not self.context_spec.concat_context
                and not contract.uses_target_context):
            logger.warning(f"{type(model).__name__} does not use target context; "
                           "--target-context-size only costs time")
        return model

    def set_context_layout(self, layout) -> None:
        """Batch sizes count the context as the models built so far lay it out
        (``ctx_fairseq.data.layouts.CONTEXT_LAYOUTS``; an ensemble's
        models share the batches, so a side counted per sentence by one model
        stays so): the splits loaded already (fairseq-train loads the
        validation split before it builds the model; batching comes after) and
        every split wrapped from now on."""
        merged = merge_context_layouts(self.context_layout, layout)
        if merged == self.context_layout:
            return
        self.context_layout = merged
        for ds in list(self.datasets.values()):
            inner = ds.inner if isinstance(ds, ConcatContextDataset) else ds
            if isinstance(inner, DocumentContextDataset):
                inner.set_context_layout(merged)
                self.dataset_to_epoch_iter.pop(ds, None)  # batches of the old count

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's; a criterion that wants it learns the number of the
        update (``label_smoothed_cross_entropy_ctx --context-stats-interval``)."""
        if hasattr(criterion, "update_num"):
            criterion.update_num = update_num
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint)
        if (self.cfg.concat_context_loss_weight != 1.0
                and type(criterion).__name__ != "LabelSmoothedCrossEntropyCtxCriterion"):
            raise InputError("--concat-context-loss-weight needs --criterion "
                             "label_smoothed_cross_entropy_ctx (other criteria would ignore it)")
        return criterion

    def checkpoint_to_restore(self) -> Optional[str]:
        """The checkpoint fairseq-train will restore after building the model
        (as ``fairseq.checkpoint_utils.load_checkpoint`` chooses it), or None
        for a new run."""
        c = self.cfg
        try:
            save_dir, restore = c.save_dir, c.restore_file
            suffix = c.checkpoint_suffix or ""
            finetune = c.finetune_from_model
            continue_once = c.continue_once
        except Exception:  # no checkpoint options (a task built outside fairseq's CLIs)
            return None
        if not save_dir or not restore:
            return None
        if restore == "checkpoint_last.pt":
            candidates = [os.path.join(save_dir, f"checkpoint_last{suffix}.pt"), continue_once,
                          finetune]
        else:
            candidates = [restore.replace(".pt", suffix + ".pt") if suffix else restore]
        return next((p for p in candidates if p and os.path.isfile(p)), None)

    # ------------------------------------------------------------- contrastive
    def context_net_input(self, split: str, line_ids: Sequence[int],
                          doc_ids: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        """The context inputs of corpus lines ``line_ids`` of ``split`` with
        their documents' true context, for scoring given sentences (e.g. a
        sentence analysed alone): the dataset's own collater on those lines,
        every ``net_input`` key but the sentences' own tokens
        (``src_tokens``, ``src_lengths``, ``prev_output_tokens``). One line
        per call: fairseq's collater orders a batch by length, so the rows
        of several lines would not follow ``line_ids``. ``doc_ids``, when
        given, are checked against ``{split}.docids``."""
        if len(line_ids) != 1:
            raise ValueError(f"context_net_input takes one line per call, got {len(line_ids)}")
        if split not in self.datasets:
            self.load_dataset(split)
        ds = self.datasets[split]
        i = int(line_ids[0])
        if not 0 <= i < len(ds):
            raise InputError(f"line {i} is outside {split} ({len(ds)} sentences)")
        if doc_ids is not None and ds.doc_names[ds.doc_index[i]] != str(doc_ids[0]):
            raise InputError(
                f"line {i} of {split} is in document {ds.doc_names[ds.doc_index[i]]!r} "
                f"({ds.docids_path}), but the record says {doc_ids[0]!r}")
        ni = ds.collater([ds[i]])["net_input"]
        return {k: v for k, v in ni.items()
                if k not in ("src_tokens", "src_lengths", "prev_output_tokens")}
