"""``transformer_context_aware``: the context-aware Transformer of Voita,
Serdyukov, Sennrich & Titov (ACL 2018), "Context-Aware Neural Machine
Translation Learns Anaphora Resolution".

Encoder (:class:`ContextAwareTransformerEncoder`): the context sentence(s)
(``src_ctx_tokens``, from the ``document_translation`` task) and the source
sentence are encoded by two encoders that share their embeddings and their
first ``N-1`` layers. The context encoder's last layer is its own (a plain
encoder layer, not shared). The source encoder's last layer
(:class:`ctx_fairseq.modules.context_gate.ContextAwareEncoderLayer`) attends
both to itself and to the context encoder's output and combines the two by a
vector gate ``g = sigmoid(W_g [c_s; c_c] + b_g)``, ``c = g c_s + (1 - g) c_c``,
before its FFN. The decoder is fairseq's. A sentence with no context (first
in its document) gets ``c_c = 0``.

Two-stage training (as in the paper): train a sentence-level ``transformer``
first, then train this model with ``--init-from-sentence-checkpoint PATH``:
every parameter whose name and shape match is copied from the sentence-level
checkpoint (embeddings, the shared layers, the source encoder's last layer
except its context attention and gate, the decoder); the context attention,
the gate and the context encoder's own last layer start fresh. What was
loaded and what was not is logged. (Resuming from this model's own
checkpoint_last.pt overrides the initialisation, as usual.)

Architectures: ``transformer_context_aware`` (Transformer base: 6 layers,
512, 8 heads, FFN 2048, as in the paper), ``transformer_context_aware_small``
(6 layers, 512, 4 heads, FFN 1024; fairseq's IWSLT shape) and
``transformer_context_aware_tiny`` (2 layers, 64, 4 heads, FFN 128; for toy
data and tests). Command-line options override the presets.

Training statistics (``--criterion label_smoothed_cross_entropy_ctx``, see
docs/criterion.md; :meth:`TransformerContextAwareModel.context_statistics`):
``gate`` (mean ``g``, the share of the source self-attention in the gated
sum, over the non-padding source tokens of sentences with context),
``ctx_mass`` (``1 - g`` on the same tokens, the share of the context) and
``ctx_frac`` (the share of non-padding source tokens whose sentence has
context).
"""

import logging
from collections import OrderedDict
from typing import Dict, List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules import LayerNorm
from torch import Tensor

from ctx_fairseq.models._fairseq_utils import (
    SourceContextModel,
    add_sentence_init_option,
    layer_being_built,
    load_sentence_checkpoint,
    model_shape,
    set_default,
    tiny_shape,
    to_namespace,
    wrap_layer,
)
from ctx_fairseq.modules.context_gate import ContextAwareEncoderLayer

logger = logging.getLogger(__name__)

__all__ = ["TransformerContextAwareModel", "ContextAwareTransformerEncoder"]


class ContextAwareTransformerEncoder(TransformerEncoderBase):
    """Source and context encoders sharing embeddings and layers ``1..N-1``.

    ``self.layers[:-1]`` are the shared layers (fairseq's), ``self.layers[-1]``
    the source encoder's context-aware last layer, ``self.context_layer`` the
    context encoder's own last layer (and ``self.context_layer_norm`` its
    final LayerNorm with ``--encoder-normalize-before``)."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False):
        if cfg.encoder.layerdrop > 0:
            raise ValueError("transformer_context_aware: --encoder-layerdrop is not supported "
                             "(the shared layers must be the same for source and context)")
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.context_layer = TransformerEncoderBase.build_encoder_layer(self, cfg)
        self.context_layer_norm = (LayerNorm(cfg.encoder.embed_dim, export=cfg.export)
                                   if cfg.encoder.normalize_before else None)

    def build_encoder_layer(self, cfg):
        if layer_being_built(self) < cfg.encoder.layers - 1:
            return super().build_encoder_layer(cfg)
        return wrap_layer(ContextAwareEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    @property
    def context_aware_layer(self) -> ContextAwareEncoderLayer:
        layer = self.layers[-1]
        return getattr(layer, "_fsdp_wrapped_module", layer)

    def _embed(self, tokens: Tensor, mask: Tensor, token_embeddings=None):
        x, emb = self.forward_embedding(tokens, token_embeddings)
        x = x * (1 - mask.unsqueeze(-1).type_as(x))
        return x.transpose(0, 1), emb

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                src_ctx_tokens: Optional[Tensor] = None, src_ctx_lengths: Optional[Tensor] = None,
                **unused):
        """As fairseq's encoder, plus ``src_ctx_tokens`` (``B x Tc``, the
        context, padded like the source; all padding: no context; None is an
        error).
        Returns fairseq's encoder-out dict plus ``context_out``
        (``Tc x B x C``) and ``context_padding_mask`` (``B x Tc``)."""
        pad = self.padding_idx
        bsz = src_tokens.size(0)
        if src_ctx_tokens is None:
            # a batch without its context inputs would silently be translated without
            # context, a different model from the one trained
            raise ValueError(
                "transformer_context_aware: the batch has no context inputs (src_ctx_tokens); "
                "run it with --task document_translation and the context options it was "
                "trained with (an explicit all-padding src_ctx_tokens means no context)")
        src_mask = src_tokens.eq(pad)
        ctx_mask = src_ctx_tokens.eq(pad)
        # Rows without context: attend to one (padding) key, then drop c_c, so
        # that no softmax sees only masked keys (NaN) and gradients stay finite.
        ctx_empty = ctx_mask.all(dim=1)
        ctx_attn_mask = torch.cat([ctx_mask[:, :1] & ~ctx_empty.unsqueeze(1), ctx_mask[:, 1:]], 1)
        context_keep = (~ctx_empty).to(self.embed_tokens.weight.dtype).view(1, bsz, 1)

        x, encoder_embedding = self._embed(src_tokens, src_mask, token_embeddings)
        c, _ = self._embed(src_ctx_tokens, ctx_mask)
        encoder_states = [x] if return_all_hiddens else []
        for layer in self.layers[:-1]:
            x = layer(x, encoder_padding_mask=src_mask)
            c = layer(c, encoder_padding_mask=ctx_attn_mask)
            if return_all_hiddens:
                encoder_states.append(x)
        c = self.context_layer(c, encoder_padding_mask=ctx_attn_mask)
        if self.context_layer_norm is not None:
            c = self.context_layer_norm(c)
        x = self.layers[-1](x, encoder_padding_mask=src_mask, context=c,
                            context_padding_mask=ctx_attn_mask, context_keep=context_keep)
        if isinstance(x, tuple):
            x = x[0]
        if return_all_hiddens:
            encoder_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        lengths = src_tokens.ne(pad).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [src_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [lengths],
            "context_out": [c],  # Tc x B x C
            "context_padding_mask": [ctx_mask],  # B x Tc
        }

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        for key, dim in (("context_out", 1), ("context_padding_mask", 0)):
            vals = encoder_out.get(key, [])
            out[key] = [vals[0].index_select(dim, new_order)] if len(vals) else []
        return out


@register_model("transformer_context_aware")
class TransformerContextAwareModel(SourceContextModel, TransformerModel):
    """Context-aware Transformer (Voita et al., 2018); see the module docstring.

    Use with ``--task document_translation`` (source context, e.g.
    ``--source-context-size 1``). ``forward`` and the context contract are
    :class:`~ctx_fairseq.models._fairseq_utils.SourceContextModel`'s."""

    uses_target_context = False

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_sentence_init_option(parser, "the context attention, the gate and the context "
                                         "encoder's last layer")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        context_aware_base_architecture(args)
        if int(args.encoder_layers) < 1:
            raise ValueError("transformer_context_aware needs --encoder-layers >= 1")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return ContextAwareTransformerEncoder(TransformerConfig.from_namespace(args), src_dict,
                                              embed_tokens)

    # ------------------------------------------------------ training statistics
    def record_context_statistics(self, enabled: bool = True) -> None:
        """Turn the gate statistics of the context-aware layer on or off
        (``record_statistics``; the attention weights are not recorded, see
        :class:`~ctx_fairseq.modules.context_gate.ContextAwareEncoderLayer`);
        turning it off drops what was recorded."""
        layer = self.encoder.context_aware_layer
        layer.record_statistics = bool(enabled)
        if not enabled:
            layer.last_statistics = None

    def context_statistics(self) -> Dict[str, Tensor]:
        """``[sum, count]`` of the last recorded forward pass: ``gate`` (the
        gate ``g`` averaged over the model dimension, over the non-padding
        source tokens of sentences with context), ``ctx_mass`` (``1 - g``, same
        tokens) and ``ctx_frac`` (tokens with context over non-padding tokens)."""
        layer = self.encoder.context_aware_layer
        st = layer.last_statistics
        if st is None:
            st = layer.gate.proj.weight.new_zeros(3, dtype=torch.float64)
        gate_sum, n_ctx, n_tok = st.unbind(0)
        return OrderedDict([
            ("gate", torch.stack([gate_sum, n_ctx])),
            ("ctx_mass", torch.stack([n_ctx - gate_sum, n_ctx])),
            ("ctx_frac", torch.stack([n_ctx, n_tok])),
        ])

    # --------------------------------------------------------- two-stage init
    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """See :func:`ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`."""
        return load_sentence_checkpoint(self, path)


# --------------------------------------------------------------------------- presets


_default = set_default


def context_aware_base_architecture(args):
    _default(args, "init_from_sentence_checkpoint", None)
    base_architecture(args)


@register_model_architecture("transformer_context_aware", "transformer_context_aware")
def transformer_context_aware(args):
    context_aware_base_architecture(args)


@register_model_architecture("transformer_context_aware", "transformer_context_aware_small")
def transformer_context_aware_small(args):
    model_shape(args, layers=6, embed_dim=512, ffn_embed_dim=1024, attention_heads=4)
    context_aware_base_architecture(args)


@register_model_architecture("transformer_context_aware", "transformer_context_aware_tiny")
def transformer_context_aware_tiny(args):
    tiny_shape(args)
    context_aware_base_architecture(args)
