"""The options of the ``document_translation`` task
(:class:`DocumentTranslationConfig`, fairseq's ``TranslationConfig`` and the
context options; the task reads them once into its
:class:`~ctx_fairseq.data.contract.ContextSpec`)."""

import logging
from dataclasses import dataclass, field
from typing import Optional


from fairseq.dataclass import ChoiceEnum
from fairseq.tasks.translation import TranslationConfig
from omegaconf import II

from ctx_fairseq.data.conditions import ABLATIONS
from ctx_fairseq.data.layouts import DIRECTIONS, DOCUMENT_CONTEXTS

logger = logging.getLogger(__name__)

#: ``--doc2doc``: none (sentence by sentence), greedy segments (Junczys-Dowmunt
#: 2019) or multi-resolution training segments (Sun et al. 2022); see
#: :mod:`ctx_fairseq.data.segments`
DOC2DOC_MODES = ("none", "greedy", "multires")


#: options that change what a model sees, compared with the checkpoint's
#: (``DocumentTranslationTask.check_context_options``)
CONTEXT_OPTIONS = ("source_context_size", "target_context_size", "context_direction",
                   "document_context", "document_memory", "context_separator",
                   "concat_context", "concat_break",
                   "doc2doc", "doc2doc_max_tokens", "doc2doc_separator")
#: of those, the ones given as a bare flag (``store_true``)
FLAG_OPTIONS = ("document_memory", "concat_context")


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
                                         "that exceed --max-tokens); several workers get the "
                                         "batches round-robin, as fairseq deals them "
                                         "(docs/document_translation.md)"})
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
    doc2doc: ChoiceEnum(list(DOC2DOC_MODES)) = field(
        default="none", metadata={"help": "translate documents as segments of consecutive "
                                          "sentences, each sentence ended by "
                                          "--doc2doc-separator (the last by </s>): greedy "
                                          "segments of at most --doc2doc-max-tokens "
                                          "(Junczys-Dowmunt 2019), or multires: training on "
                                          "each document split into 1, 2, 4, ... chunks "
                                          "(Sun et al. 2022; other splits are segmented "
                                          "greedily); any sentence-level architecture; needs "
                                          "--source-context-size 0 (docs/doc2doc.md)"})
    doc2doc_max_tokens: int = field(
        default=512, metadata={"help": "--doc2doc: the most tokens of a segment, counted on "
                                       "its longer side, separators and the final </s> "
                                       "included (a longer sentence is a segment alone)"})
    doc2doc_separator: str = field(
        default="<sep>", metadata={"help": "--doc2doc: the symbol ending each sentence of a "
                                           "segment but the last (added to both dictionaries "
                                           "when missing)"})
    doc2doc_frame: bool = field(
        default=False, metadata={"help": "--doc2doc generation: decode within the "
                                         "sentence-count frame (as many sentences as the "
                                         "source; transformer_gtrans always does)"})
    doc2doc_min_sentence_len: int = field(
        default=1, metadata={"help": "--doc2doc-frame: the tokens a sentence needs before a "
                                     "separator may end it"})
    doc2doc_max_len_a: float = field(
        default=1.5, metadata={"help": "--doc2doc-frame: sentence i has at most "
                                       "a*|src_i|+b tokens (this is a)"})
    doc2doc_max_len_b: int = field(
        default=10, metadata={"help": "--doc2doc-frame: sentence i has at most "
                                      "a*|src_i|+b tokens (this is b)"})
    lr_scale_pretrained: float = field(
        default=1.0, metadata={"help": "training from a sentence checkpoint "
                                       "(--finetune-from-model, --init-from-sentence-"
                                       "checkpoint): learning-rate multiplier of the "
                                       "parameters loaded from it (G-Transformer: 0.2)"})
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
