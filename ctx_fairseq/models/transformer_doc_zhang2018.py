"""``transformer_doc_zhang2018``: the document-level Transformer of Zhang,
Luan, Sun, Zhai, Xu, Zhang & Liu (EMNLP 2018), "Improving the Transformer
Translation Model with Document-Level Context", one of the context-aware
baselines of Maruf et al. (NAACL 2019, Tables 3-5).

* **Context encoder** (:class:`ZhangEncoder`): the previous source sentences
  (``src_ctx_tokens`` from ``--task document_translation
  --source-context-size N``, concatenated, each ended by ``</s>``) are
  embedded with the source encoder's embeddings and positions (shared) and
  encoded by ``--context-encoder-layers N_c`` self-attention layers of their
  own (``encoder.context_layers``; fairseq encoder layers).
* **Context attention** (:class:`ctx_fairseq.modules.doc_context_attention.DocContextAttention`,
  the equations): in every encoder layer between the self-attention and the
  FFN (:class:`ZhangEncoderLayer`), in every decoder layer between the
  self-attention and the encoder-decoder attention (:class:`ZhangDecoderLayer`),
  each with its context gate; ``--context-integration both|encoder|decoder``
  (``both`` is the paper's model; Maruf et al. compare the integration into
  the encoder and into the decoder separately).
* **Two-step training** (the paper's training method): step 1 trains the
  sentence-level ``transformer``; step 2 builds this model with
  ``--init-from-sentence-checkpoint PATH`` (every sentence-level parameter
  copied) and ``--freeze-sentence-level`` (only the document-level
  parameters -- context encoder, context attentions, gates and their
  LayerNorms -- are trained: the sentence-level model is frozen in the
  second step).

This file wires the sub-layer into fairseq: the layers subclass fairseq's
``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase`` (parameter
names unchanged, so a sentence-level checkpoint fills them) and add the
sub-layer to their ``forward``; the encoder and decoder subclass fairseq's
and only compute (encoder) or read (decoder) the context, then run fairseq's
own layer loops, handing each context layer the context for that call.
Decoding is incremental: the context is encoded once per batch (in
``encoder_out``, reordered with the beam by :meth:`ZhangEncoder.reorder_encoder_out`),
each decoder layer's context keys/values are cached in fairseq's incremental
state at the first step and reordered with it.

A sentence without context (the first of its document) is computed exactly
as by the sentence-level model (each context sub-layer is the identity for
it). Choices where the paper is silent: docs/transformer_doc_zhang2018.md.

Architectures: ``transformer_doc_zhang2018`` (Transformer base, 6+6 layers,
512, 8 heads, FFN 2048, ``N_c = 1``) and ``transformer_doc_zhang2018_tiny``
(2+2 layers, 64, 4 heads, FFN 128; toy data and tests). The paper's context
is the two previous source sentences: ``--source-context-size 2`` (a task
option; ``ctx-demo`` passes it).

Training statistics (``--criterion label_smoothed_cross_entropy_ctx``):
``gate_enc`` / ``gate_dec`` (mean ``lambda``, the weight of the
sentence-level path, over the encoder / decoder context sub-layers and the
non-padding tokens of the sentences with context; with gating only) and
``ctx_frac`` (the share of those tokens among all non-padding tokens).
"""

import logging
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.models._fairseq_utils import (
    SourceContextModel,
    add_sentence_init_option,
    load_sentence_checkpoint,
    set_default,
    tiny_shape,
    to_namespace,
    two_stage_defaults,
    wrap_layer,
)
from ctx_fairseq.modules.encoder_sublayers import EncoderLayerSubLayers, attention_bias
from ctx_fairseq.modules.doc_context_attention import (
    COMBINE_CHOICES,
    DocContextAttention,
    context_attention_mask,
)

logger = logging.getLogger(__name__)

__all__ = ["TransformerDocZhang2018Model", "ZhangEncoder", "ZhangDecoder",
           "ZhangEncoderLayer", "ZhangDecoderLayer"]

INTEGRATIONS = ("both", "encoder", "decoder")
#: the paper's context: the two previous source sentences
PAPER_CONTEXT_SIZE = 2
#: keys of the context in ``encoder_out``
CONTEXT_KEYS = (("context_out", 1), ("context_attn_mask", 0), ("context_padding_mask", 0),
                ("context_has", 0))


def _unwrap(layer):
    return getattr(layer, "_fsdp_wrapped_module", layer)


def _sub_layer(cfg, embed_dim: int, heads: int, normalize_before: bool,
               context_dim: int) -> DocContextAttention:
    return DocContextAttention(
        embed_dim, heads, context_dim=context_dim, attention_dropout=cfg.attention_dropout,
        dropout=cfg.dropout, normalize_before=normalize_before,
        combine=getattr(cfg, "context_combine", "gate") or "gate", q_noise=cfg.quant_noise.pq,
        qn_block_size=cfg.quant_noise.pq_block_size, export=cfg.export)


class _TakesContext:
    """A layer with a context sub-layer: the encoder or decoder sets
    ``context_inputs`` (``context``, ``attn_mask``, ``has_context``) for the
    duration of one forward call of its stack."""

    context_inputs: Optional[Dict[str, Tensor]] = None

    def _context(self, x: Tensor, padding_mask: Optional[Tensor],
                 incremental_state=None) -> Tensor:
        ctx = self.context_inputs
        if ctx is None:
            raise RuntimeError(f"{type(self).__name__}: no context was handed to this layer "
                               "(it runs inside ZhangEncoder / ZhangDecoder)")
        return self.context_attn(x, ctx["context"], ctx["attn_mask"], ctx["has_context"],
                                 padding_mask=padding_mask, incremental_state=incremental_state)


class ZhangEncoderLayer(_TakesContext, EncoderLayerSubLayers, TransformerEncoderLayerBase):
    """fairseq's encoder layer with the context attention sub-layer between
    the self-attention and the FFN (``context_attn``); the self-attention and
    FFN sub-layers are fairseq's
    (:class:`~ctx_fairseq.modules.encoder_sublayers.EncoderLayerSubLayers`)."""

    def __init__(self, cfg, return_fc: bool = False):
        super().__init__(cfg, return_fc=return_fc)
        self.context_attn = _sub_layer(cfg, self.embed_dim,
                                       cfg.encoder.attention_heads, self.normalize_before,
                                       cfg.encoder.embed_dim)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor],
                attn_mask: Optional[Tensor] = None):
        x = self.self_attention_sublayer(x, encoder_padding_mask, attention_bias(attn_mask, x))
        x = self._context(x, encoder_padding_mask)
        return self.ffn_sublayer(x)


class ZhangDecoderLayer(_TakesContext, TransformerDecoderLayerBase):
    """fairseq's decoder layer with the context attention sub-layer between
    the self-attention and the encoder-decoder attention (``context_attn``).
    The NormFormer options (``--scale-attn``, ``--scale-heads``,
    ``--scale-fc``, ``--scale-resids``) act as in fairseq's layer;
    ``--cross-self-attention`` is not supported."""

    def __init__(self, cfg, no_encoder_attn: bool = False, add_bias_kv: bool = False,
                 add_zero_attn: bool = False):
        if cfg.cross_self_attention:
            raise ValueError("transformer_doc_zhang2018: --cross-self-attention is not supported")
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)
        self.context_attn = _sub_layer(cfg, self.embed_dim,
                                       cfg.decoder.attention_heads, self.normalize_before,
                                       cfg.encoder.embed_dim)

    def forward(self, x, encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state: Optional[List[Tensor]] = None,
                prev_attn_state: Optional[List[Tensor]] = None,
                self_attn_mask: Optional[Tensor] = None,
                self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False):
        if prev_self_attn_state is not None or prev_attn_state is not None or self.onnx_trace:
            raise NotImplementedError("ZhangDecoderLayer: prev_*_attn_state / ONNX tracing")
        if need_head_weights:
            need_attn = True
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False,
                              attn_mask=self_attn_mask)
        if self.c_attn is not None:
            T, B = x.size(0), x.size(1)
            x = torch.einsum("tbhd,h->tbhd", x.view(T, B, self.nh, self.head_dim), self.c_attn)
            x = x.reshape(T, B, self.embed_dim)
        if self.attn_ln is not None:
            x = self.attn_ln(x)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        x = self._context(x, self_attn_padding_mask, incremental_state)

        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights)
            x = self.residual_connection(self.dropout_module(x), residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        if self.ffn_layernorm is not None:
            x = self.ffn_layernorm(x)
        x = self.dropout_module(self.fc2(x))
        if self.w_resid is not None:
            residual = torch.mul(self.w_resid, residual)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, attn, None


class _HandsContext:
    """Sets ``context_inputs`` on the stack's context layers for one call."""

    def context_layers_of_stack(self) -> List[_TakesContext]:
        # every layer (indexing, not iteration: a LayerDropModuleList skips layers
        # at random when iterated in training)
        layers = [_unwrap(self.layers[i]) for i in range(len(self.layers))]
        return [layer for layer in layers if isinstance(layer, _TakesContext)]

    def _run_with_context(self, inputs: Dict[str, Tensor], fn, *args):
        layers = self.context_layers_of_stack()
        for layer in layers:
            layer.context_inputs = inputs
        try:
            return fn(*args)
        finally:
            for layer in layers:
                layer.context_inputs = None


class ZhangEncoder(_HandsContext, TransformerEncoderBase):
    """fairseq's encoder plus the context encoder (``context_layers``, and
    ``context_layer_norm`` with ``--encoder-normalize-before``); with encoder
    integration its layers are :class:`ZhangEncoderLayer`.

    ``forward(..., src_ctx_tokens)`` returns fairseq's encoder-out dict plus
    ``context_out`` (``Tc x B x C``, the context encoder's output ``D``),
    ``context_padding_mask`` (``B x Tc``), ``context_attn_mask`` (the key
    mask the context attentions use, see
    :func:`~ctx_fairseq.modules.doc_context_attention.context_attention_mask`)
    and ``context_has`` (``(B,)`` bool)."""

    def __init__(self, cfg, dictionary, embed_tokens, args, return_fc: bool = False):
        self.integration = args.context_integration
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        n_c = int(args.context_encoder_layers)
        if n_c < 0:
            raise ValueError(f"--context-encoder-layers must be >= 0, got {n_c}")
        self.context_layers = nn.ModuleList(
            [TransformerEncoderBase.build_encoder_layer(self, cfg) for _ in range(n_c)])
        self.context_layer_norm = (LayerNorm(cfg.encoder.embed_dim, export=cfg.export)
                                   if cfg.encoder.normalize_before and n_c > 0 else None)

    def build_encoder_layer(self, cfg):
        if getattr(self, "integration", "both") in ("both", "encoder"):
            return wrap_layer(ZhangEncoderLayer(cfg, return_fc=self.return_fc), cfg)
        return super().build_encoder_layer(cfg)

    def encode_context(self, src_ctx_tokens: Tensor) -> Dict[str, Tensor]:
        """The context encoder: ``D`` (``Tc x B x C``) of the concatenated
        context sentences, with the masks (see the class docstring)."""
        padding = src_ctx_tokens.eq(self.padding_idx)
        attn_mask, has_context = context_attention_mask(padding)
        c, _ = self.forward_embedding(src_ctx_tokens)
        c = (c * (1 - padding.unsqueeze(-1).type_as(c))).transpose(0, 1)
        for layer in self.context_layers:
            c = layer(c, encoder_padding_mask=attn_mask)
            if isinstance(c, tuple):
                c = c[0]
        if self.context_layer_norm is not None:
            c = self.context_layer_norm(c)
        return {"context": c, "padding_mask": padding, "attn_mask": attn_mask,
                "has_context": has_context}

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                src_ctx_tokens: Optional[Tensor] = None, src_ctx_lengths: Optional[Tensor] = None,
                **unused):
        if src_ctx_tokens is None:
            raise ValueError(
                "transformer_doc_zhang2018: the batch has no context inputs (src_ctx_tokens); "
                "run it with --task document_translation --source-context-size N, the context "
                "options it was trained with (an all-padding row of src_ctx_tokens means no "
                "context)")
        if src_ctx_tokens.size(0) != src_tokens.size(0):
            raise ValueError(f"src_ctx_tokens has {src_ctx_tokens.size(0)} rows for "
                             f"{src_tokens.size(0)} sentences")
        ctx = self.encode_context(src_ctx_tokens)
        out = self._run_with_context(
            ctx, self.forward_scriptable, src_tokens, src_lengths, return_all_hiddens,
            token_embeddings)
        out["context_out"] = [ctx["context"]]
        out["context_padding_mask"] = [ctx["padding_mask"]]
        out["context_attn_mask"] = [ctx["attn_mask"]]
        out["context_has"] = [ctx["has_context"]]
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        for key, dim in CONTEXT_KEYS:
            vals = encoder_out.get(key, [])
            out[key] = [vals[0].index_select(dim, new_order)] if len(vals) else []
        return out


class ZhangDecoder(_HandsContext, TransformerDecoderBase):
    """fairseq's decoder; with decoder integration its layers are
    :class:`ZhangDecoderLayer`, attending to ``encoder_out["context_out"]``."""

    def __init__(self, cfg, dictionary, embed_tokens, args, no_encoder_attn: bool = False,
                 output_projection=None):
        self.integration = args.context_integration
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn: bool = False):
        if getattr(self, "integration", "both") in ("both", "decoder"):
            return wrap_layer(ZhangDecoderLayer(cfg, no_encoder_attn), cfg)
        return super().build_decoder_layer(cfg, no_encoder_attn)

    def extract_features_scriptable(self, prev_output_tokens,
                                    encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state=None, full_context_alignment: bool = False,
                                    alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        args = (prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                alignment_layer, alignment_heads)
        parent = super().extract_features_scriptable
        if not self.context_layers_of_stack():
            return parent(*args)
        if encoder_out is None or not encoder_out.get("context_out"):
            raise ValueError("transformer_doc_zhang2018: the decoder needs the context encoder's "
                             "output (encoder_out['context_out']); encode with ZhangEncoder")
        ctx = {"context": encoder_out["context_out"][0],
               "attn_mask": encoder_out["context_attn_mask"][0],
               "has_context": encoder_out["context_has"][0]}
        return self._run_with_context(ctx, parent, *args)


@register_model("transformer_doc_zhang2018")
class TransformerDocZhang2018Model(SourceContextModel, TransformerModel):
    """The document-level Transformer of Zhang et al. (2018); see the module
    docstring. Use with ``--task document_translation --source-context-size 2``.
    ``forward`` and the context contract are
    :class:`~ctx_fairseq.models._fairseq_utils.SourceContextModel`'s."""

    uses_target_context = False

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--context-encoder-layers", type=int, metavar="N",
                            help="N_c, the context encoder's self-attention layers (default 1)")
        parser.add_argument("--context-integration", choices=INTEGRATIONS,
                            help="context attention in every encoder and decoder layer (both, "
                                 "the paper's model, default), or only in the encoder or the "
                                 "decoder layers (Maruf et al. 2019's two settings)")
        parser.add_argument("--context-combine", choices=COMBINE_CHOICES,
                            help="context gating (gate, the paper's model, default) or a "
                                 "residual connection (residual, the paper's comparison "
                                 "without gating)")
        add_sentence_init_option(
            parser, "the document-level parameters",
            freeze="the document-level parameters (context encoder, context attentions, "
                   "gates); needs --init-from-sentence-checkpoint in a new run")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        doc_zhang2018_base_architecture(args)
        if getattr(args, "checkpoint_activations", False):
            raise ValueError("transformer_doc_zhang2018: --checkpoint-activations is not "
                             "supported (the context reaches the layers outside their "
                             "arguments)")
        options = task_options(task)
        if options is not None and options.document_task:
            n, whole = options.source_context_size, options.whole_document
            if n <= 0 and not whole:
                raise ValueError("transformer_doc_zhang2018 needs source context: "
                                 f"--source-context-size {PAPER_CONTEXT_SIZE} (the paper's)")
            if n != PAPER_CONTEXT_SIZE or whole:
                logger.info(f"transformer_doc_zhang2018: source context of "
                            f"{'the whole document' if whole else n} sentence(s); the paper "
                            f"uses {PAPER_CONTEXT_SIZE}")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return ZhangEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, args)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return ZhangDecoder(cfg, tgt_dict, embed_tokens, args,
                            no_encoder_attn=cfg.no_cross_attention)

    # ------------------------------------------------------------- two steps
    @staticmethod
    def is_document_level(name: str) -> bool:
        """The document-level parameters ``theta_d``: the context encoder,
        the context attention sub-layers (attention, gate, LayerNorm)."""
        return (name.startswith("encoder.context_layers.")
                or name.startswith("encoder.context_layer_norm.")
                or ".context_attn." in f".{name}")

    def document_level_parameters(self) -> Iterator[Tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.named_parameters() if self.is_document_level(n))

    def sentence_level_parameters(self) -> Iterator[Tuple[str, nn.Parameter]]:
        """``theta_s``: the sentence-level Transformer's parameters."""
        return ((n, p) for n, p in self.named_parameters() if not self.is_document_level(n))

    def finish_setup(self, init_path: Optional[str], new_run: bool) -> None:
        """Called by the ``document_translation`` task once the model is
        built: step-2 initialisation from the sentence-level checkpoint
        (``init_path``), then ``--freeze-sentence-level``."""
        freeze = bool(getattr(self.args, "freeze_sentence_level", False))
        if freeze and new_run and not init_path:
            raise ValueError("--freeze-sentence-level trains only the document-level parameters "
                             "on top of the step-1 sentence-level model: give "
                             "--init-from-sentence-checkpoint PATH")
        if init_path:
            self.load_sentence_checkpoint(init_path)
        if freeze:
            for _, p in self.sentence_level_parameters():
                p.requires_grad_(False)
            n = sum(p.numel() for _, p in self.document_level_parameters())
            logger.info(f"--freeze-sentence-level: training the {n:,} document-level "
                        "parameters only")

    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """See :func:`ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`."""
        return load_sentence_checkpoint(self, path)

    # ------------------------------------------------------ training statistics
    def context_sub_layers(self) -> Dict[str, List[DocContextAttention]]:
        """``{"enc": [...], "dec": [...]}``: the context attention sub-layers."""
        return {side: [layer.context_attn for layer in stack.context_layers_of_stack()]
                for side, stack in (("enc", self.encoder), ("dec", self.decoder))}

    def record_context_statistics(self, enabled: bool = True) -> None:
        for subs in self.context_sub_layers().values():
            for sub in subs:
                sub.record_statistics = bool(enabled)
                if not enabled:
                    sub.last_statistics = None

    def context_statistics(self) -> Dict[str, Tensor]:
        """``[sum, count]`` of the last recorded forward pass: ``gate_enc`` /
        ``gate_dec`` (with gating), ``ctx_frac`` (see the module docstring)."""
        zero = self.encoder.embed_tokens.weight.new_zeros(3, dtype=torch.float64)
        stats, frac = OrderedDict(), None
        for side, subs in self.context_sub_layers().items():
            if not subs:
                continue
            st = [s.last_statistics if s.last_statistics is not None else zero for s in subs]
            total = torch.stack(st).sum(0)
            if subs[0].gate is not None:
                stats[f"gate_{side}"] = total[:2].clone()
            if frac is None:
                frac = torch.stack([st[0][1], st[0][2]])
        stats["ctx_frac"] = frac if frac is not None else zero[:2].clone()
        return stats


# --------------------------------------------------------------------------- presets


def doc_zhang2018_base_architecture(args):
    set_default(args, "context_encoder_layers", 1)
    set_default(args, "context_integration", "both")
    set_default(args, "context_combine", "gate")
    two_stage_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_doc_zhang2018", "transformer_doc_zhang2018")
def transformer_doc_zhang2018(args):
    """The paper's setting: Transformer base (6+6 layers, d=512, 8 heads, FFN
    2048), one context encoder layer, context attention in every encoder and
    decoder layer, with gates."""
    doc_zhang2018_base_architecture(args)


@register_model_architecture("transformer_doc_zhang2018", "transformer_doc_zhang2018_tiny")
def transformer_doc_zhang2018_tiny(args):
    tiny_shape(args)
    doc_zhang2018_base_architecture(args)
