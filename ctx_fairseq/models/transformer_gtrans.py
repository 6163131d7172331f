"""``transformer_gtrans``: G-Transformer (Bao, Zhang, Teng, Chen & Luo, ACL
2021), a Transformer over multi-sentence segments whose attentions are local
to each sentence (group attention) in every layer, with global attention
mixed in by a gate in the top layers. The equations live in
:mod:`ctx_fairseq.modules.group_attention`; docs/transformer_gtrans.md maps
them to the code.

Input: the segments of ``--task document_translation --doc2doc greedy|multires``
(``x_1 <sep> x_2 ... x_n </s>``, a plain fairseq batch: ``src_tokens``,
``src_lengths``, ``prev_output_tokens``). The group tags are computed from the
tokens and the separator, whose index the model looks up in the task's
dictionaries at build time (the task's ``--doc2doc-separator``; a model built
from bare dictionaries, as tests do, uses ``<sep>``). Without a doc2doc task,
or without the separator in both dictionaries, building is an
:class:`~ctx_fairseq.errors.InputError`.

* :class:`GTransEncoder` / :class:`GTransDecoder`: fairseq's encoder and
  decoder whose layers' attentions are group attentions
  (:class:`~ctx_fairseq.modules.group_attention.GroupAttention`; the top
  ``--gtrans-global-layers`` layers of each stack
  :class:`~ctx_fairseq.modules.group_attention.GatedGroupAttention`: encoder
  self-attention, decoder self- and cross-attention). Each pass computes the
  tags, builds the masks and attaches them to its attentions for the pass;
  the rest is fairseq's pass unchanged. The encoder's output carries the
  source tags (``src_group_tags``, reordered with the beams); the decoder
  keeps its running separator count and key tags in the incremental state.
* word dropout (``--word-dropout P``) of the source and the decoder input in
  training, in :meth:`TransformerGTransModel.forward`.
* two-stage training: a sentence-level ``transformer`` checkpoint loads into
  this model (:meth:`TransformerGTransModel.load_state_dict`, e.g. through
  fairseq's ``--finetune-from-model``, or ``--init-from-sentence-checkpoint``):
  every name matches except the new global attentions and gates
  (:meth:`~TransformerGTransModel.new_parameter_names`), which keep their
  initialisation. The smaller learning rate of the loaded parameters
  (``--lr-scale-pretrained``) and the sentence-count frame of generation
  (``--doc2doc-frame``) are not this file's.

Architectures: ``transformer_gtrans`` (Transformer base, as the paper),
``transformer_gtrans_small`` (fairseq's IWSLT shape: 6 layers, 512, 4 heads,
FFN 1024) and ``transformer_gtrans_tiny`` (2 layers, 64, 4 heads, FFN 128).
"""

import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Set, Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.errors import InputError
from ctx_fairseq.models._fairseq_utils import (
    add_sentence_init_option,
    layer_being_built,
    load_sentence_checkpoint,
    model_shape,
    set_default,
    tiny_shape,
    to_namespace,
    wrap_layer,
)
from ctx_fairseq.modules.group_attention import (
    GatedGroupAttention,
    GroupAttention,
    GroupTagState,
    attached_masks,
    cross_group_mask,
    self_group_mask,
    source_group_tags,
    target_group_tags,
    word_dropout,
)

logger = logging.getLogger(__name__)

__all__ = ["TransformerGTransModel", "GTransEncoder", "GTransDecoder", "separator_indices"]

#: the separator of a model built from bare dictionaries (no task)
DEFAULT_SEPARATOR = "<sep>"
#: the paper's number of top layers with global attention
PAPER_GLOBAL_LAYERS = 2
#: the submodules of a gated attention that a sentence-level transformer lacks
NEW_SUBMODULES = ("global_attn", "gate")


def separator_indices(task) -> Tuple[int, int]:
    """The separator's index in the source and target dictionaries: the doc2doc
    task's ``--doc2doc-separator`` (read through the context contract,
    ``task_options``), ``<sep>`` for bare dictionaries (no task)."""
    spec = task_options(task)
    if spec is None:
        sep = DEFAULT_SEPARATOR
    else:
        mode = getattr(spec, "doc2doc", "none") or "none"
        if not spec.document_task or mode == "none":
            given = "--doc2doc none" if spec.document_task else f"--task {type(task).__name__}"
            raise InputError(
                f"--arch transformer_gtrans translates multi-sentence segments: expected "
                f"--task document_translation --doc2doc greedy|multires, got {given}")
        sep = getattr(spec, "doc2doc_separator", None) or DEFAULT_SEPARATOR
    out = []
    for side, d in (("source", task.source_dictionary), ("target", task.target_dictionary)):
        idx = d.index(sep)
        if idx == d.unk():
            raise InputError(f"--arch transformer_gtrans: the sentence separator {sep!r} is not "
                             f"in the {side} dictionary; expected the doc2doc task to add it")
        out.append(idx)
    return out[0], out[1]


def _global_range(cfg, layers: int) -> range:
    n = int(getattr(cfg, "gtrans_global_layers", PAPER_GLOBAL_LAYERS))
    return range(layers - n, layers)


def _layers(part):
    """Every layer of an encoder or decoder, unwrapped: by index, since
    iterating fairseq's ``LayerDropModuleList`` in training drops layers at
    random (and draws from the generator the pass itself draws from)."""
    layers = part.layers
    return [getattr(layers[i], "_fsdp_wrapped_module", layers[i]) for i in range(len(layers))]


# ------------------------------------------------------------------ layers


class GroupEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with a group (or gated) self-attention."""

    def __init__(self, cfg, gated: bool, return_fc: bool = False):
        self._gated = gated
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        cls = GatedGroupAttention if self._gated else GroupAttention
        return cls(embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
                   self_attention=True, q_noise=self.quant_noise,
                   qn_block_size=self.quant_noise_block_size)


class GroupDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with group (or gated) self- and cross-attention."""

    def __init__(self, cfg, gated: bool, no_encoder_attn: bool = False):
        self._gated = gated
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        cls = GatedGroupAttention if self._gated else GroupAttention
        return cls(embed_dim, cfg.decoder.attention_heads, dropout=cfg.attention_dropout,
                   self_attention=True, q_noise=self.quant_noise,
                   qn_block_size=self.quant_noise_block_size)

    def build_encoder_attention(self, embed_dim, cfg):
        cls = GatedGroupAttention if self._gated else GroupAttention
        return cls(embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
                   vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                   encoder_decoder_attention=True, q_noise=self.quant_noise,
                   qn_block_size=self.quant_noise_block_size)


# ------------------------------------------------------------------ encoder / decoder


class GTransEncoder(TransformerEncoderBase):
    """fairseq's encoder with group self-attention (module docstring)."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.separator: Optional[int] = None

    def build_encoder_layer(self, cfg):
        gated = layer_being_built(self) in _global_range(cfg, cfg.encoder.layers)
        return wrap_layer(GroupEncoderLayer(cfg, gated, return_fc=self.return_fc), cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        """fairseq's pass with the group masks attached; the output also holds
        ``src_group_tags`` (``B x S``, -1 on padding)."""
        if self.separator is None:
            raise RuntimeError("GTransEncoder: no separator index (built outside "
                               "TransformerGTransModel.build_model)")
        tags = source_group_tags(src_tokens, self.separator, self.padding_idx)
        mask = self_group_mask(tags, causal=False)
        with attached_masks((layer.self_attn, mask) for layer in _layers(self)):
            out = super().forward_scriptable(src_tokens, src_lengths, return_all_hiddens,
                                             token_embeddings)
        out["src_group_tags"] = [tags]
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        tags = encoder_out.get("src_group_tags", [])
        out["src_group_tags"] = [tags[0].index_select(0, new_order)] if len(tags) else []
        return out


class GTransDecoder(TransformerDecoderBase):
    """fairseq's decoder with group self- and cross-attention (module docstring)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None):
        if no_encoder_attn:
            raise InputError("transformer_gtrans: --no-cross-attention is not supported "
                             "(the cross-attention is a group attention)")
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False,
                         output_projection=output_projection)
        self.separator: Optional[int] = None
        self.group_tags = GroupTagState()

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        gated = layer_being_built(self) in _global_range(cfg, cfg.decoder.layers)
        return wrap_layer(GroupDecoderLayer(cfg, gated, no_encoder_attn), cfg)

    def _masks(self, prev_output_tokens: Tensor, encoder_out, incremental_state,
               causal: bool) -> Tuple[Tensor, Tensor]:
        """``(self mask, cross mask)`` of this pass (or decoding step)."""
        if self.separator is None:
            raise RuntimeError("GTransDecoder: no separator index (built outside "
                               "TransformerGTransModel.build_model)")
        src = encoder_out.get("src_group_tags", []) if encoder_out is not None else []
        if not len(src):
            raise RuntimeError("GTransDecoder: the encoder output has no src_group_tags "
                               "(expected the GTransEncoder's output)")
        if incremental_state is None:
            query = target_group_tags(prev_output_tokens, self.separator, self.padding_idx)
            self_mask = self_group_mask(query, causal=causal)
        else:
            query, keys = self.group_tags.step(incremental_state, prev_output_tokens,
                                               self.separator, self.padding_idx)
            self_mask = query.unsqueeze(2) == keys.unsqueeze(1)
        return self_mask, cross_group_mask(query, src[0])

    def extract_features_scriptable(self, prev_output_tokens, encoder_out,
                                    incremental_state=None, full_context_alignment=False,
                                    alignment_layer=None, alignment_heads=None):
        """fairseq's pass with the group masks attached (``full_context_alignment``:
        no causal mask, as fairseq's)."""
        self_mask, cross_mask = self._masks(prev_output_tokens, encoder_out,
                                            incremental_state, not full_context_alignment)
        pairs = []
        for layer in _layers(self):
            pairs += [(layer.self_attn, self_mask), (layer.encoder_attn, cross_mask)]
        with attached_masks(pairs):
            return super().extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state=incremental_state,
                full_context_alignment=full_context_alignment,
                alignment_layer=alignment_layer, alignment_heads=alignment_heads)


# ------------------------------------------------------------------ model


@register_model("transformer_gtrans")
class TransformerGTransModel(TransformerModel):
    """G-Transformer (see the module docstring)."""

    #: generation always uses the sentence-count frame (``--doc2doc-frame``,
    #: ``ctx_fairseq.tasks.sentence_frame``): the output keeps the source's sentences
    always_frame = True

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--gtrans-global-layers", type=int, metavar="N",
            help="the top N layers of the encoder and of the decoder add global attention, "
                 f"mixed with the group attention by a gate (paper: {PAPER_GLOBAL_LAYERS}; "
                 "0: group attention only)")
        parser.add_argument(
            "--word-dropout", type=float, metavar="P",
            help="in training, replace each source and decoder-input word by <unk> with "
                 "probability P (never a special symbol nor the separator; default 0)")
        add_sentence_init_option(parser, "the global attentions and gates")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        gtrans_base_architecture(args)
        src_sep, tgt_sep = separator_indices(task)
        for side in ("encoder", "decoder"):
            layers = int(getattr(args, f"{side}_layers"))
            if not 0 <= int(args.gtrans_global_layers) <= layers:
                raise InputError(f"--gtrans-global-layers {args.gtrans_global_layers}: "
                                 f"expected 0..{layers} (--{side}-layers {layers})")
        if not 0.0 <= float(args.word_dropout) < 1.0:
            raise InputError(f"--word-dropout {args.word_dropout}: expected 0 <= P < 1")
        if getattr(args, "cross_self_attention", False):
            raise InputError("transformer_gtrans: --cross-self-attention is not supported "
                             "(the decoder's self-attention is a group attention)")
        if getattr(args, "checkpoint_activations", False):
            raise InputError("transformer_gtrans: --checkpoint-activations is not supported "
                             "(the group masks are attached for the pass only)")
        model = super().build_model(args, task)
        model.encoder.separator, model.decoder.separator = src_sep, tgt_sep
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return GTransEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return GTransDecoder(TransformerConfig.from_namespace(args), tgt_dict, embed_tokens,
                             no_encoder_attn=getattr(args, "no_cross_attention", False))

    def forward(self, src_tokens, src_lengths, prev_output_tokens,
                return_all_hiddens: bool = True, features_only: bool = False,
                alignment_layer: Optional[int] = None, alignment_heads: Optional[int] = None):
        """fairseq's forward; in training, word dropout of ``src_tokens`` and
        ``prev_output_tokens`` first (``--word-dropout``)."""
        p = float(getattr(self.args, "word_dropout", 0.0) or 0.0)
        if self.training and p > 0:
            src_tokens = self._drop_words(src_tokens, self.encoder, p)
            prev_output_tokens = self._drop_words(prev_output_tokens, self.decoder, p)
        return super().forward(src_tokens, src_lengths, prev_output_tokens,
                               return_all_hiddens=return_all_hiddens,
                               features_only=features_only, alignment_layer=alignment_layer,
                               alignment_heads=alignment_heads)

    @staticmethod
    def _drop_words(tokens: Tensor, part, p: float) -> Tensor:
        d = part.dictionary
        return word_dropout(tokens, p, d.unk(), d.nspecial, part.separator)

    # --------------------------------------------------------- two-stage init
    def new_parameter_names(self) -> Set[str]:
        """The parameters a sentence-level transformer does not have: the
        global attentions and gates of the top layers (the contract's name)."""
        out = set()
        for name, _ in self.named_parameters():
            parts = name.split(".")
            if any(p in NEW_SUBMODULES and parts[i - 1] in ("self_attn", "encoder_attn")
                   for i, p in enumerate(parts) if i > 0):
                out.add(name)
        return out

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's loading, also from a sentence-level transformer: the new
        parameters missing from ``state_dict`` keep this model's values
        (logged); everything else is loaded as fairseq loads it (strict)."""
        missing = sorted(n for n in self.new_parameter_names() if n not in state_dict)
        if missing:
            own = self.state_dict()
            state_dict = OrderedDict(state_dict)
            for name in missing:
                state_dict[name] = own[name]
            logger.info(f"transformer_gtrans: {len(missing)} new tensors not in the loaded "
                        f"state, kept at their initialisation: {', '.join(missing)}")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                       args=args)

    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """``--init-from-sentence-checkpoint``: see
        :func:`~ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`."""
        new = self.new_parameter_names()
        return load_sentence_checkpoint(self, path, new=lambda name: name in new)


# --------------------------------------------------------------------------- presets


def gtrans_base_architecture(args):
    set_default(args, "gtrans_global_layers", PAPER_GLOBAL_LAYERS)
    set_default(args, "word_dropout", 0.0)
    set_default(args, "init_from_sentence_checkpoint", None)
    base_architecture(args)


@register_model_architecture("transformer_gtrans", "transformer_gtrans")
def transformer_gtrans(args):
    gtrans_base_architecture(args)


@register_model_architecture("transformer_gtrans", "transformer_gtrans_small")
def transformer_gtrans_small(args):
    model_shape(args, layers=6, embed_dim=512, ffn_embed_dim=1024, attention_heads=4)
    gtrans_base_architecture(args)


@register_model_architecture("transformer_gtrans", "transformer_gtrans_tiny")
def transformer_gtrans_tiny(args):
    tiny_shape(args)
    gtrans_base_architecture(args)
