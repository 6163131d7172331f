"""The ``transformer_selective_doc`` model and its architectures (fairseq
registration, options, two-stage set-up, frozen copies, statistics)."""

import copy
import logging
from collections import OrderedDict
from typing import Any, Dict, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture
from torch import Tensor

from ctx_fairseq.data.contract import ContextContract, ContextSpec, task_options
from ctx_fairseq.errors import InputError
from ctx_fairseq.models._fairseq_utils import (
    encode_and_decode,
    load_sentence_checkpoint,
    set_default,
    tiny_shape,
    to_namespace,
    two_stage_defaults,
)
from ctx_fairseq.models.transformer_selective_doc.common import (
    MEMORY_CACHE_SENTENCES,
    MEMORY_KEYS,
    cut_slice,
)
from ctx_fairseq.models.transformer_selective_doc.decoder import SelectiveDocDecoder
from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder
from ctx_fairseq.modules.selective_attention import WORD_CAPACITY
from ctx_fairseq.modules.sentence_cache import SentenceStateCache

logger = logging.getLogger("ctx_fairseq.models.transformer_selective_doc")


@register_model("transformer_selective_doc")
class TransformerSelectiveDocModel(TransformerModel):
    """Selective attention over the whole document (Maruf et al., 2019); see
    the module docstring. Use with ``--task document_translation
    --document-context online|offline --document-memory`` (decoder
    integration: also ``--target-context-size 1``)."""

    context_contract = ContextContract(inputs=MEMORY_KEYS)

    @property
    def uses_target_context(self) -> bool:
        """Only decoder integration reads the target memory (the task warns
        about ``--target-context-size`` otherwise)."""
        return self.args.context_integration == "decoder"

    @property
    def context_layout(self) -> Dict[str, str]:
        """What the task's ``--max-tokens`` counts (``MEMORY_LAYOUTS`` of
        :mod:`ctx_fairseq.data.document_dataset`): the frozen memory is
        encoded by the stage-1 model's copy, apart from the batch's sentences
        (a query that is also a memory row is encoded by both), the shared
        one by the model itself, each sentence once."""
        return {"memory": "separate" if self.args.context_memory == "frozen" else "shared"}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--doc-attention", choices=["hierarchical", "flat-sentence",
                                                        "flat-word"],
                            help="hierarchical (Eq. 3-5) or the flat baselines (Eq. 6)")
        parser.add_argument("--sentence-attn", choices=["sparsemax", "softmax"],
                            help="sentence-level normaliser (Eq. 3; default sparsemax)")
        parser.add_argument("--word-attn", choices=["softmax", "sparsemax"],
                            help="word-level normaliser (Eq. 4): softmax (sparse-soft, "
                                 "default) or sparsemax (sparse-sparse)")
        parser.add_argument("--context-integration", choices=["encoder", "decoder"],
                            help="encoder (monolingual) or decoder (bilingual) context")
        parser.add_argument("--context-memory", choices=["shared", "frozen"],
                            help="memory from this model with gradients (shared) or from the "
                                 "frozen stage-1 model (frozen, the paper's)")
        parser.add_argument("--memory-cache-sentences", type=int, metavar="N",
                            help="--context-memory frozen: keep the frozen model's states of "
                                 "up to N memory sentences (entries; least recently used out) "
                                 "in a cache on the CPU (in the model's precision), so that a "
                                 "sentence is encoded once, not in every batch; 0: no cache "
                                 f"(default {MEMORY_CACHE_SENTENCES})")
        parser.add_argument("--doc-sentence-distance", type=int, metavar="N",
                            help="beyond the paper: learned per-head bias on the sentence-level "
                                 "scores by the signed sentence distance (query - memory "
                                 "position, clipped to [-N, N]), for recency; 0: off, the "
                                 "paper's model (default 0)")
        parser.add_argument("--doc-word-capacity", type=int, metavar="K",
                            help="removed (0 is the only value): the word level is streamed, "
                                 "exact and faster than the capacity was; a checkpoint or "
                                 "command line with K > 0 runs the exact word level, with a "
                                 "warning")
        parser.add_argument("--dense-doc-attention", action="store_true",
                            help="kept for old command lines: the streamed word level weights "
                                 "every sentence by its Eq. 3 weight (0 outside the support), "
                                 "so the selective and dense formulations are one computation")
        parser.add_argument("--freeze-sentence-level", action="store_true",
                            help="stage 2: train only the Document-level Context Layer")
        parser.add_argument("--init-from-sentence-checkpoint", type=str, metavar="PATH",
                            help="stage 2: initialise every parameter whose name and shape "
                                 "match from this sentence-level transformer checkpoint")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        selective_doc_base_architecture(args)
        options = task_options(task)
        if options is not None and (not options.document_task or
                                    options.document_context not in ("online", "offline")
                                    or not options.document_memory):
            raise ValueError("transformer_selective_doc needs --task document_translation "
                             "--document-context online|offline --document-memory")
        args.document_context_mode = options.document_context if options is not None \
            else "online"
        if int(getattr(args, "doc_word_capacity", 0) or 0) != 0:
            logger.warning(
                f"--doc-word-capacity {args.doc_word_capacity}: the word level's capacity was "
                "removed; the streamed word level is exact and faster: running it (the model's "
                "parameters are the same)")
            args.doc_word_capacity = 0
        if options is not None and options.memory_precomputed:
            if args.context_memory != "frozen":
                raise ValueError(
                    "--memory-precomputed (--max-tokens counts only the batch's own sentences, "
                    "not its document memory) needs --context-memory frozen: a shared memory "
                    "is encoded with gradients in every batch, and --max-tokens would not bound "
                    "it. Use --context-memory frozen or drop --memory-precomputed")
            if int(args.memory_cache_sentences) <= 0:
                logger.warning("--memory-precomputed with --memory-cache-sentences 0: every "
                               "batch encodes its whole document memory (without gradients)")
        if options is not None and options.length_buckets > 1 and \
                args.context_memory != "frozen":
            raise InputError(
                "--length-buckets needs --context-memory frozen: a shared memory is encoded "
                "together with the batch's sources in one call, which the length groups would "
                "split. Use --context-memory frozen or drop --length-buckets")
        defaults = options if options is not None else ContextSpec()
        args.left_pad_source = defaults.left_pad_source
        args.left_pad_target = defaults.left_pad_target
        if args.context_integration == "decoder" and options is not None and \
                options.target_context_size <= 0:
            raise ValueError("--context-integration decoder needs the target side of the "
                             "document memory: --target-context-size 1")
        if args.context_integration == "decoder" and \
                (getattr(args, "decoder_output_dim", None) or args.decoder_embed_dim) \
                != args.decoder_embed_dim:
            raise ValueError("--context-integration decoder needs --decoder-output-dim equal to "
                             "--decoder-embed-dim (the context layer gates the decoder states)")
        if args.context_integration == "decoder" and \
                float(getattr(args, "decoder_layerdrop", 0) or 0) > 0:
            raise ValueError("--context-integration decoder reads the last decoder layer's source "
                             "attention, which --decoder-layerdrop may drop; use "
                             "--decoder-layerdrop 0")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SelectiveDocEncoder(TransformerConfig.from_namespace(args), src_dict,
                                   embed_tokens, args)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return SelectiveDocDecoder(cfg, tgt_dict, embed_tokens, args,
                                   no_encoder_attn=cfg.no_cross_attention)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.args = args
        self.memory_cache: Optional[SentenceStateCache] = None
        size = int(getattr(args, "memory_cache_sentences", MEMORY_CACHE_SENTENCES))
        if args.context_memory == "frozen" and size > 0:
            self.set_memory_cache(SentenceStateCache(size))

    # ------------------------------------------------------------ frozen memory cache
    def set_memory_cache(self, cache: Optional[SentenceStateCache]) -> None:
        """Use ``cache`` (or none) for the frozen memory, e.g.
        ``SentenceStateCache(n, dtype=None)`` to keep states in the model's
        precision. A plain attribute of the model, its encoder and its decoder,
        not a module or buffer: never in the state dict."""
        self.memory_cache = cache
        self.encoder.memory_cache = cache
        self.decoder.memory_cache = cache

    def clear_memory_cache(self) -> None:
        if self.memory_cache is not None:
            self.memory_cache.clear()

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's, and the frozen memory cache is emptied (new weights)."""
        self.clear_memory_cache()
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                           args=args)
        finally:
            self.clear_memory_cache()

    # ------------------------------------------------------------- two stages
    def sentence_level_parameters(self):
        """Everything except the Document-level Context Layer (and frozen copies)."""
        for name, p in self.named_parameters():
            if ".context_layer." not in f".{name}" and "memory_" not in name:
                yield name, p

    def finish_setup(self, init_path: Optional[str], new_run: bool) -> None:
        """Called by the ``document_translation`` task once the model is built:
        stage-2 initialisation (``init_path``), the frozen memory copies (taken
        after it; a checkpoint being restored overwrites them with its own),
        and ``--freeze-sentence-level``."""
        frozen = self.args.context_memory == "frozen"
        if new_run and frozen and not init_path:
            raise ValueError("--context-memory frozen takes the memory from the stage-1 "
                             "sentence-level model: give --init-from-sentence-checkpoint PATH "
                             "(or use --context-memory shared)")
        if init_path:
            load_sentence_checkpoint(self, init_path)
        if frozen and not self.args.freeze_sentence_level:
            self._make_frozen_copies()
        self.clear_memory_cache()
        if self.args.freeze_sentence_level:
            for _, p in self.sentence_level_parameters():
                p.requires_grad_(False)

    def load_sentence_checkpoint(self, path: str):
        return load_sentence_checkpoint(self, path)

    @staticmethod
    def _frozen_copy(part, layer_attr: str, copy_attr: str):
        """A frozen deep copy of ``part`` (encoder or decoder) without its
        context layer, frozen copy or memory cache. fairseq keys incremental state by an id
        each module draws when built, and ``deepcopy`` copies it: the copy's
        attention modules would share the decoder's buffers, and beam search
        (``reorder_incremental_state_scripting`` visits every submodule) would
        reorder them twice. The copy's modules get fresh ids."""
        attrs = (layer_attr, copy_attr, "memory_cache")
        saved = [getattr(part, a) for a in attrs]
        for a in attrs:
            setattr(part, a, None)
        try:
            frozen = copy.deepcopy(part)
        finally:
            for a, v in zip(attrs, saved):
                setattr(part, a, v)
        for module in frozen.modules():
            if hasattr(module, "init_incremental_state"):
                module.init_incremental_state()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return frozen

    def _make_frozen_copies(self) -> None:
        """Frozen copies of the sentence-level encoder (and decoder, for
        decoder integration) as they are now, for ``--context-memory frozen``;
        the memory cache is emptied."""
        self.clear_memory_cache()
        self.encoder.memory_encoder = self._frozen_copy(self.encoder, "context_layer",
                                                        "memory_encoder")
        if self.args.context_integration == "decoder":
            self.decoder.memory_decoder = self._frozen_copy(self.decoder, "context_layer",
                                                            "memory_decoder")

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, **doc):
        return encode_and_decode(self, src_tokens, src_lengths, prev_output_tokens,
                                 return_all_hiddens, features_only, alignment_layer,
                                 alignment_heads, **doc)

    def context_stats(self) -> Dict[str, Any]:
        """The last forward's context statistics (support sizes, gate)."""
        layer = self.encoder if self.encoder.context_layer is not None else self.decoder
        return layer.last_info or {}

    # ------------------------------------------------------ training statistics
    def _context_part(self):
        return self.encoder if self.encoder.context_layer is not None else self.decoder

    def record_context_statistics(self, enabled: bool = True) -> None:
        """Turn the statistics of the Document-level Context Layer on or off
        (``record_statistics``: ``return_stats`` only, no attention weights).
        They are read from ``last_info``, which every forward pass sets (as
        before: :meth:`context_stats`)."""
        self._context_part().record_statistics = bool(enabled)

    def grouped_logits(self, enabled: bool = True) -> None:
        """``--length-buckets``: leave the decoder's logits grouped by length
        (``M x 1 x V``, see :meth:`SelectiveDocDecoder.forward`) on or off; a
        loss that reads its targets through :meth:`get_targets` gets them
        grouped alike (``label_smoothed_cross_entropy_ctx`` turns it on for
        its forward pass). Batches without groups are not affected."""
        self.decoder.grouped_logits = bool(enabled)

    def get_targets(self, sample, net_output):
        """fairseq's targets; for grouped logits (:meth:`grouped_logits`)
        grouped the same way, ``M x 1`` (a group's padding positions are
        padding here too, which the loss ignores; with the decoder's
        ``target_index`` only the real tokens)."""
        groups = net_output[1].get("length_groups") if len(net_output) > 1 else None
        if not groups:
            return super().get_targets(sample, net_output)
        target = sample["target"]
        left = bool(getattr(self.args, "left_pad_target", False))
        T = target.size(1)
        flat = torch.cat([target.index_select(0, rows)[:, cut_slice(T, width, left)].reshape(-1)
                          for rows, width in groups], 0)
        index = net_output[1].get("target_index")
        if index is not None:  # the logits of the real target tokens only
            flat = flat.index_select(0, index)
        return flat.unsqueeze(1)

    def context_statistics(self) -> Dict[str, Tensor]:
        """``[sum, count]`` of the last recorded forward pass (see the module
        docstring): ``gate``, ``ctx_mass``, ``ctx_frac``, ``sent_support``,
        ``sent_visible`` and, when the attention has a word level
        (hierarchical, flat-word), ``word_support``; hierarchical also
        ``word_overflow``: the share of the counted (token, head) pairs whose
        Eq. 3 support held more sentences than the word level's capacity
        (``--doc-word-capacity``; 0 = the word level was exact), summed on the
        device (``word_overflow_sum``) like the others."""
        part = self._context_part()
        attn = part.context_layer.context_attn
        info = part.last_info or {}
        zero = attn.out_proj.weight.new_zeros((), dtype=torch.float64)

        def get(key: str) -> Tensor:
            v = info.get(key)
            return zero if v is None else v.detach().to(torch.float64).reshape(())

        gate_sum, n_ctx, n_tok = get("gate_sum"), get("gate_tokens"), get("query_tokens")
        n_th = get("num_token_heads")
        stats = OrderedDict([
            ("gate", torch.stack([gate_sum, n_ctx])),
            ("ctx_mass", torch.stack([n_ctx - gate_sum, n_ctx])),
            ("ctx_frac", torch.stack([n_ctx, n_tok])),
            ("sent_support", torch.stack([get("sentence_support_sum"), n_th])),
            ("sent_visible", torch.stack([get("visible_sentences_sum"), n_th])),
        ])
        if attn.uses_words:
            stats["word_support"] = torch.stack([get("word_support_sum"),
                                                 get("num_support_pairs")])
        if attn.attention == "hierarchical":
            stats["word_overflow"] = torch.stack([get("word_overflow_sum"), n_th])
        return stats


_default = set_default


def selective_doc_base_architecture(args):
    _default(args, "doc_attention", "hierarchical")
    _default(args, "sentence_attn", "sparsemax")
    _default(args, "word_attn", "softmax")
    _default(args, "context_integration", "encoder")
    _default(args, "context_memory", "frozen")  # the paper's (Sec. 3.3): the stage-1 model's states
    _default(args, "memory_cache_sentences", MEMORY_CACHE_SENTENCES)
    _default(args, "dense_doc_attention", False)
    _default(args, "doc_word_capacity", WORD_CAPACITY)
    _default(args, "doc_sentence_distance", 0)  # beyond the paper; 0 = off
    two_stage_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc")
def transformer_selective_doc(args):
    selective_doc_base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc_dec")
def transformer_selective_doc_dec(args):
    """Decoder (bilingual) integration."""
    _default(args, "context_integration", "decoder")
    selective_doc_base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc_tiny")
def transformer_selective_doc_tiny(args):
    tiny_shape(args)
    selective_doc_base_architecture(args)
