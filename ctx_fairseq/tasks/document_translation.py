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
    With ``--document-memory``: another document's memory, or memory
    sentences of random tokens.
``--sample-context-size K``
    training only (Fernandes et al. 2021; contextual-mt's option of that
    name): per sentence and epoch only its ``k`` nearest previous context
    sentences are kept, ``k`` uniform on ``0..K``, one draw for both sides
    (:meth:`DocumentContextDataset.context_cap`), so that the empty context
    of CXMI and every size up to ``K`` are in distribution. Bounded context
    of previous sentences only (not a document memory).
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
    for ``--max-tokens``); distributed shards then hold whole documents.
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

import dataclasses
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

import torch
from fairseq import utils
from fairseq.data import LanguagePairDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.data.concat_dataset import ConcatContextDataset, concat_limits, strip_prefix
from ctx_fairseq.data.conditions import ABLATIONS
from ctx_fairseq.data.contract import ContextSpec, model_contract
from ctx_fairseq.data.document_dataset import (
    DIRECTIONS,
    DOCUMENT_CONTEXTS,
    DocumentContextDataset,
    DocumentShardedEpochBatchIterator,
    merge_context_layouts,
    normalise_context_layout,
    read_docids,
)
from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.context_options import (
    CONTEXT_OPTIONS,
    context_option_diff,
    context_spec,
    validate_context_options,
)
from ctx_fairseq.tasks.generation import (
    ForcedPrefixes,
    OwnTargetContextState,
    batch_device,
    best_tokens_on_cpu,
    to_device,
)
from ctx_fairseq.tasks.interactive import InteractiveDocumentState, InteractiveDocumentView

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
    context_dropout: float = field(
        default=0.0, metadata={"help": "training: drop the whole context of a sentence with this "
                                       "probability (it gets the empty context of a document's "
                                       "first sentence; with --document-memory, no memory), so "
                                       "that one model serves with and without context"})
    coword_dropout: float = field(
        default=0.0, metadata={"help": "training: replace each token (BPE unit) of the current "
                                       "source sentence by <unk> with this probability (CoWord "
                                       "dropout; "
                                       "never </s>)"})
    sampled_context_size: int = field(
        default=0, metadata={"help": "training: per sentence and epoch, keep only the k nearest "
                                     "previous context sentences, k drawn uniformly from 0..K "
                                     "(K this value, at most the context size; 0: off), so "
                                     "that one model is in distribution at every context size "
                                     "from none to K (Fernandes et al. 2021, contextual-mt's "
                                     "--sample-context-size); with --document-memory, a window "
                                     "drawn from 0..K"})
    memory_window: Optional[int] = field(
        default=None, metadata={"help": "outside training (validation, generation, scoring): a "
                                        "document memory shows each sentence the memory "
                                        "sentences at most K positions away (0: the whole "
                                        "memory; default: the --sampled-context-size K it was "
                                        "trained on, else the whole memory)"})
    sample_context_size: int = field(
        default=0, metadata={"help": "deprecated: sets --sampled-context-size and, with "
                                     "--document-memory, --memory-window"})
    document_context: ChoiceEnum(list(DOCUMENT_CONTEXTS)) = field(
        default="none", metadata={"help": "whole-document context: online (all previous "
                                          "sentences) or offline (all other sentences); implies "
                                          "--document-batching"})
    document_memory: bool = field(
        default=False, metadata={"help": "with --document-context: batches carry the document "
                                         "memory (every sentence of the batch's documents that "
                                         "a sentence may see, each once: mem_src_tokens, ...) "
                                         "instead of per-sentence context; for whole-document "
                                         "models such as transformer_selective_doc"})
    memory_precomputed: bool = field(
        default=False, metadata={"help": "with --document-memory: the model reads the memory "
                                         "from a cache of a frozen model (transformer_selective_doc "
                                         "--context-memory frozen), so batch sizes count only the "
                                         "sentences encoded with gradients"})
    document_batching: bool = field(
        default=False, metadata={"help": "batches of whole documents (or chunks of documents "
                                         "that exceed --max-tokens); shards keep documents whole"})
    length_buckets: int = field(
        default=1, metadata={"help": "with --document-memory: the collater groups a batch's "
                                     "sentences into at most N groups of similar length, and "
                                     "transformer_selective_doc runs its sentence-level layers "
                                     "per group, each padded to its own longest sentence (a "
                                     "document batch is padded to its longest: on TVsub about "
                                     "2.2 times the real tokens). The results are the same to "
                                     "rounding; on the CPU 4 trains 1.3 times as fast as 1 (the "
                                     "values measured: docs/transformer_selective_doc.md); on "
                                     "a GPU each group adds host synchronisations. 1: one "
                                     "group"})
    context_separator: str = field(
        default="</s>", metadata={"help": "symbol that ends each context sentence"})
    gold_target_context: bool = field(
        default=False, metadata={"help": "generation: target context from the references"})
    target_context_file: Optional[str] = field(
        default=None, metadata={"help": "generation: target context from this file of "
                                        "hypotheses (one per line, corpus order)"})
    concat_context: bool = field(
        default=False, metadata={"help": "concatenation baseline: prepend the context sentences "
                                         "to the source (and, with --target-context-size, to the "
                                         "target), each ended by --concat-break; any "
                                         "sentence-level architecture"})
    concat_break: str = field(
        default="<brk>", metadata={"help": "--concat-context: the symbol ending each context "
                                           "sentence (added to the dictionaries if missing)"})
    concat_context_loss_weight: float = field(
        default=1.0, metadata={"help": "--concat-context with target context: weight of the "
                                       "target context tokens in the loss (needs --criterion "
                                       "label_smoothed_cross_entropy_ctx unless 1)"})
    own_target_context: bool = field(
        default=False, metadata={"help": "generation: target context from the model's own "
                                         "translations of the previous sentences, in document "
                                         "order"})
    allow_context_change: bool = field(
        default=False, metadata={"help": "generation: allow context options other than those "
                                         "the checkpoint was trained with (an experiment)"})
    seed: int = II("common.seed")
    gen_subset: str = II("dataset.gen_subset")
    save_dir: str = II("checkpoint.save_dir")
    restore_file: str = II("checkpoint.restore_file")
    checkpoint_suffix: str = II("checkpoint.checkpoint_suffix")
    finetune_from_model: Optional[str] = II("checkpoint.finetune_from_model")
    continue_once: Optional[str] = II("checkpoint.continue_once")


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


@register_task("document_translation", dataclass=DocumentTranslationConfig)
class DocumentTranslationTask(TranslationTask):
    """Translation with document structure and context sentences in
    ``net_input`` (see the module docstring)."""

    cfg: DocumentTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        if cfg.concat_context:  # before the model is built: the vocabulary includes it
            for d in (src_dict, tgt_dict):
                if d.index(cfg.concat_break) == d.unk() and cfg.concat_break != d.unk_word:
                    d.add_symbol(cfg.concat_break)
        super().__init__(cfg, src_dict, tgt_dict)
        self._interactive: Optional[InteractiveDocumentState] = None
        self._truncation_logged = set()
        self._own_state: Optional[OwnTargetContextState] = None
        #: the context layout of the models built (``set_context_layout``)
        self.context_layout: Dict[str, str] = normalise_context_layout(None)
        self._check_options()  # (bad options raise InputError: one line, errors.py)
        #: the one context specification, built once from the options: what
        #: the datasets, the models' builders, generation and the tools read
        self.context_spec: ContextSpec = context_spec(self.cfg, self.src_dict)

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
        if self.cfg.concat_context:
            return ["src_tokens"]  # the context is inside the sequences
        if self.cfg.document_memory:
            return ["mem_src_tokens"]
        keys = []
        if self.cfg.source_context_size > 0:
            keys.append("src_ctx_tokens")
        if self.cfg.target_context_size > 0:
            keys.append("tgt_ctx_tokens")
        return keys

    def _data_path(self, split: str, epoch: int) -> str:
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        return paths[(epoch - 1) % len(paths)]

    def _separator(self) -> int:
        if self.cfg.concat_context:
            return self.src_dict.index(self.cfg.concat_break)
        sep = _symbol_index(self.src_dict, self.cfg.context_separator, "source")
        if self.cfg.target_context_size > 0:
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
        if c.concat_context:
            limits = concat_limits(base, c.max_source_positions, c.max_target_positions,
                                   generation)
        inner = DocumentContextDataset(
            base, doc_ids, spec, separator=self._separator(), tgt_context=tgt_context,
            max_context_tokens=limits, docids_path=docids_path,
            context_layout=None if c.concat_context else self.context_layout)
        if c.concat_context:
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
        if tgt_file and self.cfg.target_context_size <= 0:
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
            if self.cfg.target_context_size <= 0:
                raise InputError("--own-target-context given, but --target-context-size is 0")
            if tgt_file or self.cfg.gold_target_context:
                raise InputError("--own-target-context, --gold-target-context and "
                                 "--target-context-file: choose one source of target context")
            if self.cfg.document_context == "offline" or (
                    self.cfg.document_context == "none" and self.cfg.context_direction != "prev"):
                raise InputError("--own-target-context: the model's own translations exist for "
                                 "previous sentences only (--context-direction prev or "
                                 "--document-context online); following sentences would get "
                                 "empty target context")
            if self.cfg.context_ablation != "none":
                raise InputError("--own-target-context with --context-ablation: the wrong "
                                 "context would come from documents not translated yet; "
                                 "translate once, then use --target-context-file with the "
                                 "ablation")
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        base = self.datasets[split]
        path = os.path.join(self._data_path(split, epoch), f"{split}.docids")
        doc_ids = read_docids(path, expected=len(base))
        tgt_context = None
        if self.cfg.target_context_size > 0 and tgt_file:
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
                    f"({path}); source context {self.cfg.source_context_size}, target context "
                    f"{self.cfg.target_context_size}, direction {self.cfg.context_direction}, "
                    f"document context {self.cfg.document_context}, ablation "
                    f"{self.cfg.context_ablation}")
        spec = self.context_spec
        if training and (spec.context_dropout or spec.coword_dropout
                         or spec.sampled_context_size):
            logger.info(f"{split}: context dropout {spec.context_dropout}, CoWord dropout "
                        f"{spec.coword_dropout}, sampled context size 0.."
                        f"{spec.sampled_context_size} (drawn per sentence and epoch from --seed "
                        f"{spec.seed}; this split only)")
        self._log_truncation(split, ds)

    #: options that change what a model sees, compared with the checkpoint's
    CONTEXT_OPTIONS = CONTEXT_OPTIONS

    def check_context_options(self, trained) -> None:
        """A model is translated with the context it was trained with: options
        that differ from the checkpoint's task are an error (unless
        ``--allow-context-change``; ``--context-ablation`` is the way to give
        wrong context on purpose)."""
        get = trained.get if hasattr(trained, "get") else lambda k, d=None: getattr(trained, k, d)
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

    # ------------------------------------------------------------ interactive
    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """``fairseq-interactive``: the input lines are sentences of a document,
        in order; a blank line starts a new document. Context is kept across
        calls (buffers)."""
        c = self.cfg
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
        if not self.uses_context:
            return super().inference_step(generator, models, sample, prefix_tokens, constraints)
        if self.cfg.own_target_context and "_view" not in sample:
            return self._own_target_context_step(generator, models, sample, prefix_tokens,
                                                 constraints)
        if self.cfg.concat_context:
            return self._concat_step(generator, models, sample, prefix_tokens, constraints)
        ni = sample["net_input"]
        if not any(k in ni for k in self.context_keys()):
            sample = self._restore_interactive_sample(sample)
        view = sample.pop("_view", None)
        if view is None or self.cfg.target_context_size <= 0:
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
            plen = one["target_prefix_len"].tolist() if self.cfg.concat_context else None
            one = to_device(one, device)
            if self.cfg.concat_context:
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
        contract = model_contract(model)
        arch = getattr(cfg, "arch", type(model).__name__)
        if self.cfg.concat_context:
            if hasattr(model, "finish_setup") or contract.inputs:
                raise InputError("--concat-context is for sentence-level architectures; "
                                 f"{arch} reads context inputs of its own")
        elif self.cfg.source_context_size > 0 or self.cfg.target_context_size > 0:
            if not contract.inputs:  # a context model's unread side: warned below
                raise InputError(
                    f"--arch {arch} does not take document context (its forward has no "
                    f"{self.context_keys()[0]}: its class declares no context_contract); use a "
                    "context-aware architecture or --source-context-size 0 "
                    "--target-context-size 0")
        if not self.cfg.concat_context:
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
        if (self.cfg.target_context_size > 0 and not self.cfg.concat_context
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

    def build_generator(self, models, args, **kwargs):
        # fairseq-generate loads its split first; fairseq-interactive loads none and
        # takes target context from the model's own translations
        if (self.cfg.target_context_size > 0 and not self.cfg.gold_target_context
                and not self.cfg.target_context_file and not self.cfg.own_target_context
                and self.datasets):
            raise InputError("generation with --target-context-size > 0 needs the target "
                             "context: --gold-target-context (references), "
                             "--target-context-file FILE (hypotheses of an earlier pass) or "
                             "--own-target-context (the model's own translations, in document "
                             "order)")
        if self.cfg.concat_context and getattr(args, "score_reference", False):
            raise InputError("--score-reference with --concat-context is not supported (fairseq's "
                             "reference scorer knows nothing of the target context); score "
                             "references with ctx-score-contrastive or a validation pass")
        if self.cfg.concat_context:  # the break only ever comes from the forced prefix
            extra = dict(kwargs.get("extra_gen_cls_kwargs") or {})
            extra["tokens_to_suppress"] = list(extra.get("tokens_to_suppress", ())) + [
                self.cfg.concat_break]
            kwargs["extra_gen_cls_kwargs"] = extra
        return super().build_generator(models, args, **kwargs)

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
