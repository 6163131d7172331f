"""``document_translation``: sentence-level translation with document context.

Extends fairseq's ``translation`` task. Besides the binarized data it reads
``{data}/{split}.docids`` (one document id per sentence, documents
contiguous; ``ctx-make-toy`` and ``ctx-prep-docs`` write it) and wraps each
split in :class:`ctx_fairseq.data.document_dataset.DocumentContextDataset`,
which adds the context sentences to ``net_input`` (``src_ctx_tokens``,
``src_ctx_lengths``, ``tgt_ctx_tokens``, ``tgt_ctx_lengths``). See
``docs/document_translation.md``.

Options (besides those of ``translation``):

``--source-context-size N`` / ``--target-context-size N``
    context sentences per direction (default 1 / 0; 0 turns a side off).
``--context-direction prev|next|both``
    previous, following or both (default prev).
``--context-ablation none|shuffled|random``
    Voita et al.'s check that a model uses real context: context of another,
    random document position, or random tokens (deterministic for ``--seed``).
``--document-context none|online|offline``
    whole-document context for document-level models: every previous sentence
    (online) or every other sentence (offline) of the document; implies
    ``--document-batching``.
``--document-batching``
    batches of whole documents (or consecutive chunks of a document too large
    for ``--max-tokens``); distributed shards then hold whole documents.
``--context-separator SYMBOL``
    token that ends each context sentence (default ``</s>``); must be in the
    dictionaries.
``--gold-target-context`` / ``--target-context-file FILE``
    at generation time, target context from the references or from a file of
    hypotheses of an earlier pass (one line per sentence, corpus order);
    ``fairseq-generate`` with ``--target-context-size > 0`` needs one of them.
"""

import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from fairseq import utils
from fairseq.data import LanguagePairDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ctx_fairseq.data.document_dataset import (
    ABLATIONS,
    DIRECTIONS,
    DOCUMENT_CONTEXTS,
    DocumentContextDataset,
    DocumentShardedEpochBatchIterator,
    read_docids,
)

logger = logging.getLogger(__name__)


@dataclass
class DocumentTranslationConfig(TranslationConfig):
    source_context_size: int = field(
        default=1, metadata={"help": "source context sentences per direction (0: none)"})
    target_context_size: int = field(
        default=0, metadata={"help": "target context sentences per direction (0: none)"})
    context_direction: ChoiceEnum(list(DIRECTIONS)) = field(
        default="prev", metadata={"help": "context before (prev), after (next) or both"})
    context_ablation: ChoiceEnum(list(ABLATIONS)) = field(
        default="none", metadata={"help": "shuffled: context of another, random document "
                                          "position; random: random tokens (for checking that a "
                                          "model uses real context)"})
    document_context: ChoiceEnum(list(DOCUMENT_CONTEXTS)) = field(
        default="none", metadata={"help": "whole-document context: online (all previous "
                                          "sentences) or offline (all other sentences); implies "
                                          "--document-batching"})
    document_batching: bool = field(
        default=False, metadata={"help": "batches of whole documents (or chunks of documents "
                                         "that exceed --max-tokens); shards keep documents whole"})
    context_separator: str = field(
        default="</s>", metadata={"help": "symbol that ends each context sentence"})
    gold_target_context: bool = field(
        default=False, metadata={"help": "generation: target context from the references"})
    target_context_file: Optional[str] = field(
        default=None, metadata={"help": "generation: target context from this file of "
                                        "hypotheses (one per line, corpus order)"})
    seed: int = II("common.seed")


def _symbol_index(dictionary, symbol: str, which: str) -> int:
    idx = dictionary.index(symbol)
    if idx == dictionary.unk() and symbol != dictionary.unk_word:
        raise ValueError(f"--context-separator {symbol!r} is not in the {which} dictionary; "
                         "use a symbol of the dictionary (default </s>)")
    return idx


def read_target_context_file(path: str, dictionary, expected: int) -> List[torch.Tensor]:
    """Hypotheses of an earlier pass, one per line in corpus order."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except OSError as err:
        raise ValueError(f"--target-context-file {path}: cannot read it ({err.strerror or err})") \
            from err
    if len(lines) != expected:
        raise ValueError(f"--target-context-file {path}: {len(lines)} lines for {expected} "
                         "sentences; expected one hypothesis per sentence, in corpus order")
    return [dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()
            for line in lines]


@register_task("document_translation", dataclass=DocumentTranslationConfig)
class DocumentTranslationTask(TranslationTask):
    """Translation with document structure and context sentences in
    ``net_input`` (see the module docstring)."""

    cfg: DocumentTranslationConfig

    def _data_path(self, split: str, epoch: int) -> str:
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        return paths[(epoch - 1) % len(paths)]

    def _separator(self) -> int:
        sep = _symbol_index(self.src_dict, self.cfg.context_separator, "source")
        if self.cfg.target_context_size > 0:
            tsep = _symbol_index(self.tgt_dict, self.cfg.context_separator, "target")
            if tsep != sep:
                raise ValueError(f"--context-separator {self.cfg.context_separator!r} has "
                                 "different indices in the source and target dictionaries")
        return sep

    def wrap(self, base, doc_ids: Sequence[str], docids_path: str,
             tgt_context: Optional[Sequence] = None) -> DocumentContextDataset:
        c = self.cfg
        return DocumentContextDataset(
            base, doc_ids, src_context_size=c.source_context_size,
            tgt_context_size=c.target_context_size, direction=c.context_direction,
            ablation=c.context_ablation, seed=c.seed, document_context=c.document_context,
            document_batching=c.document_batching, separator=self._separator(),
            tgt_context=tgt_context, max_src_context_tokens=c.max_source_positions,
            max_tgt_context_tokens=c.max_target_positions, docids_path=docids_path)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        base = self.datasets[split]
        path = os.path.join(self._data_path(split, epoch), f"{split}.docids")
        doc_ids = read_docids(path, expected=len(base))
        tgt_context = None
        if self.cfg.target_context_size > 0 and self.cfg.target_context_file:
            tgt_context = read_target_context_file(self.cfg.target_context_file, self.tgt_dict,
                                                   len(base))
        self.datasets[split] = self.wrap(base, doc_ids, path, tgt_context)
        ds = self.datasets[split]
        logger.info(f"{split}: {len(ds)} sentences in {len(ds.doc_start)} documents "
                    f"({path}); source context {self.cfg.source_context_size}, target context "
                    f"{self.cfg.target_context_size}, direction {self.cfg.context_direction}, "
                    f"document context {self.cfg.document_context}, ablation "
                    f"{self.cfg.context_ablation}")

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """fairseq-interactive: the input lines form one document."""
        base = LanguagePairDataset(src_tokens, src_lengths, self.source_dictionary,
                                   tgt_dict=self.target_dictionary, constraints=constraints)
        if self.cfg.target_context_size > 0:
            raise ValueError("--target-context-size > 0 is not supported interactively")
        return self.wrap(base, ["interactive"] * len(base), "<interactive input>")

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None,
                           max_positions=None, ignore_invalid_inputs=False,
                           required_batch_size_multiple=1, seed=1, num_shards=1, shard_id=0,
                           num_workers=0, epoch=1, data_buffer_size=0,
                           disable_iterator_cache=False, skip_remainder_batch=False,
                           grouped_shuffling=False, update_epoch_batch_itr=False):
        doc_sharding = (isinstance(dataset, DocumentContextDataset) and dataset.document_batching
                        and num_shards > 1)
        if not doc_sharding:
            return super().get_batch_iterator(
                dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                max_positions=max_positions, ignore_invalid_inputs=ignore_invalid_inputs,
                required_batch_size_multiple=required_batch_size_multiple, seed=seed,
                num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
                data_buffer_size=data_buffer_size, disable_iterator_cache=disable_iterator_cache,
                skip_remainder_batch=skip_remainder_batch, grouped_shuffling=grouped_shuffling,
                update_epoch_batch_itr=update_epoch_batch_itr)
        # whole documents per shard: same batches as fairseq would make, dealt by document
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
            dataset, dataset.collater, batches, dataset.doc_index, seed=seed,
            num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
            buffer_size=data_buffer_size, skip_remainder_batch=skip_remainder_batch,
            grouped_shuffling=grouped_shuffling,
            reuse_dataloader=getattr(self.cfg, "reuse_dataloader", True),
            persistent_workers=getattr(self.cfg, "persistent_workers", True))
        if reuse:
            self.dataset_to_epoch_iter[dataset] = epoch_iter
        return epoch_iter

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.source_context_size > 0 or self.cfg.target_context_size > 0:
            params = inspect.signature(model.forward).parameters
            takes = "src_ctx_tokens" in params or any(
                p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
            if not takes:
                raise ValueError(
                    f"--arch {getattr(cfg, 'arch', type(model).__name__)} does not take document "
                    "context (its forward has no src_ctx_tokens); use a context-aware "
                    "architecture or --source-context-size 0 --target-context-size 0")
        path = getattr(cfg, "init_from_sentence_checkpoint", None)
        if path and not from_checkpoint and hasattr(model, "load_sentence_checkpoint"):
            model.load_sentence_checkpoint(path)
        if self.cfg.target_context_size > 0 and not getattr(model, "uses_target_context", False):
            logger.warning(f"{type(model).__name__} does not use target context; "
                           "--target-context-size only costs time")
        return model

    def build_generator(self, models, args, **kwargs):
        if (self.cfg.target_context_size > 0 and not self.cfg.gold_target_context
                and not self.cfg.target_context_file):
            raise ValueError("generation with --target-context-size > 0 needs the target "
                             "context: --gold-target-context (references) or "
                             "--target-context-file FILE (hypotheses of an earlier pass)")
        return super().build_generator(models, args, **kwargs)

    # ------------------------------------------------------------- contrastive
    def context_net_input(self, split: str, line_ids: Sequence[int],
                          doc_ids: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        """The context inputs of corpus lines ``line_ids`` of ``split`` (one
        row each, padded as in training), for scoring given sentences (e.g.
        contrastive pairs) with their documents' true context. ``doc_ids``,
        when given, are checked against ``{split}.docids``."""
        if split not in self.datasets:
            self.load_dataset(split)
        ds = self.datasets[split]
        out: Dict[str, torch.Tensor] = {}
        for k, i in enumerate(line_ids):
            if not 0 <= i < len(ds):
                raise ValueError(f"line {i} is outside {split} ({len(ds)} sentences)")
            if doc_ids is not None and ds.doc_names[ds.doc_index[i]] != str(doc_ids[k]):
                raise ValueError(
                    f"line {i} of {split} is in document {ds.doc_names[ds.doc_index[i]]!r} "
                    f"({ds.docids_path}), but the record says {doc_ids[k]!r}")
        for side in ("src", "tgt"):
            if side in ds.windows:
                out.update(ds.collate_context([ds.context_tokens(i, side) for i in line_ids],
                                              side))
        if "src" in ds.windows and ds.document_context != "none":
            out["src_ctx_sent_offsets"] = data_utils.collate_tokens(
                [ds.context_sent_offsets(i, "src") for i in line_ids], 0, 0,
                left_pad=ds.left_pad_source, pad_to_length=1)
        return out
