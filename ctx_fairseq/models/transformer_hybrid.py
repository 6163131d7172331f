"""``transformer_hybrid``: the Transformer with hybrid local/global self-attention
(Xu et al., ACL 2019, "Leveraging Local and Global Patterns for Self-Attention
Networks").

The chosen layers get a :class:`~ctx_fairseq.modules.hybrid_attention.HybridMultiheadAttention`
as self-attention (the equations and every modelling choice are documented in that
module); all other layers are fairseq's own, unchanged. Options:

``--hybrid-mode {gate,concat,local,gauss-window,gauss-center,gauss-both}``
    ``gate`` is the paper's model; the others are Table 1's comparisons
    (HYBRID (Concate), LOCAL PATTERN, NEIGHBOR, LOCAL H, LOCAL S).
``--hybrid-window m``
    words on each side of the local window (default 1, i.e. window size 3).
``--hybrid-encoder-layers SPEC``
    1-based layers (``all``, ``none``, ``1-3``, ``1,3,5``); default ``1-2``, the
    lowest two encoder layers as in the paper.
``--hybrid-decoder-layers SPEC``
    default ``none``. Decoder layers use a causal window ``i-m <= j <= i`` and
    support incremental decoding.
``--hybrid-gate-per-head``
    one gate per head (and token) instead of one per token.

Preset: ``transformer_hybrid_wmt_en_de`` (base Transformer, gate, m = 1, encoder
layers 1-2), the paper's setting.

Training statistics (``--criterion label_smoothed_cross_entropy_ctx``, see
docs/criterion.md): with ``--hybrid-mode gate`` the model reports the mean gate
``g`` of Eq. (5) of every hybrid layer, ``gate_enc1``, ``gate_enc2``, ...,
``gate_dec1``, ... (1-based layer numbers), over the non-padding tokens; the
other modes have no gate and report nothing. Recording reuses the attention's
``record_gates`` hook (``record_context_statistics`` / ``context_statistics``,
protocol in :mod:`ctx_fairseq.modules.context_statistics`).

Two-stage training: ``--init-from-sentence-checkpoint PATH`` (read by
``--task document_translation --source-context-size 0`` in a new run, as for
the context models) starts from a stage-1 sentence-level ``transformer`` of the
same shape. Every transformer tensor is loaded under its own name (a hybrid
layer's self-attention subclasses fairseq's ``MultiheadAttention``: its
``q/k/v/out_proj`` are the global pattern's). New, left at their
initialisation: the gate ``gate_proj`` (zero weights: ``g = 0.5`` of Eq. 5 at
the start), ``local_out_proj`` (``concat``), the Gaussian modes' position
predictors. A checkpoint with a tensor of another shape, or tensors left over
(more layers, another model), is an error; the log lists the loaded and the
new tensors (:func:`~ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`).
"""

import logging
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Dict, List, Tuple

import torch
from fairseq import utils
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
    base_architecture,
)
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from ctx_fairseq.models._fairseq_utils import (
    add_sentence_init_option,
    build_chosen_layer,
    load_sentence_checkpoint,
    warn_sentence_init_unread,
)
from ctx_fairseq.modules.hybrid_attention import (
    HYBRID_MODES,
    HybridAttentionConfig,
    HybridMultiheadAttention,
)
from ctx_fairseq.modules.layer_spec import parse_layer_spec

logger = logging.getLogger(__name__)

DEFAULTS = dict(
    hybrid_mode="gate",
    hybrid_window=1,
    hybrid_encoder_layers="1-2",
    hybrid_decoder_layers="none",
    hybrid_gate_per_head=False,
)


@dataclass(frozen=True)
class HybridSettings:
    """The parsed and validated ``--hybrid-*`` options of one model."""

    attention: HybridAttentionConfig
    encoder_layers: Tuple[int, ...]  # 0-based
    decoder_layers: Tuple[int, ...]  # 0-based

    @classmethod
    def from_args(cls, args) -> "HybridSettings":
        """Read the options from an argparse namespace or a TransformerConfig
        (fairseq copies unknown namespace attributes onto the config)."""

        def get(name):
            return utils.safe_getattr(args, name, DEFAULTS[name])

        window = get("hybrid_window")
        if isinstance(window, str):
            try:
                window = int(window)
            except ValueError:
                raise ValueError(
                    f"--hybrid-window: expected a non-negative integer, got {window!r}")
        attention = HybridAttentionConfig(
            mode=get("hybrid_mode"), window=window,
            gate_per_head=bool(get("hybrid_gate_per_head")),
        )
        n_enc = _num_layers(args, "encoder")
        n_dec = _num_layers(args, "decoder")
        enc = parse_layer_spec(get("hybrid_encoder_layers"), n_enc, "--hybrid-encoder-layers")
        dec = parse_layer_spec(get("hybrid_decoder_layers"), n_dec, "--hybrid-decoder-layers")
        if dec and utils.safe_getattr(args, "cross_self_attention", False):
            raise ValueError(
                "--hybrid-decoder-layers cannot be combined with --cross-self-attention "
                "(the local window is defined over the target prefix only)")
        return cls(attention, enc, dec)


def _num_layers(args, side: str) -> int:
    sub = utils.safe_getattr(args, side, None)
    if sub is not None and not isinstance(sub, (str, int)):
        n = utils.safe_getattr(sub, "layers", None)
        if n is not None:
            return int(n)
    return int(utils.safe_getattr(args, f"{side}_layers", 6))




def hybrid_self_attention(layer, embed_dim: int, heads: int, cfg, causal: bool):
    """The hybrid self-attention of an encoder (bidirectional window) or
    decoder (``causal``) layer, built with the layer's hybrid settings and
    fairseq's dropout and quantisation noise."""
    return HybridMultiheadAttention(embed_dim, heads, config=layer.hybrid, causal=causal,
                                    dropout=cfg.attention_dropout, q_noise=layer.quant_noise,
                                    qn_block_size=layer.quant_noise_block_size)


class HybridTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer whose self-attention is hybrid (bidirectional window)."""

    def __init__(self, cfg, hybrid: HybridAttentionConfig, return_fc: bool = False):
        self.hybrid = hybrid  # read by build_self_attention during super().__init__
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return hybrid_self_attention(self, embed_dim, cfg.encoder.attention_heads, cfg,
                                     causal=False)


class HybridTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer whose self-attention is hybrid (causal window)."""

    def __init__(self, cfg, hybrid: HybridAttentionConfig, no_encoder_attn=False,
                 add_bias_kv=False, add_zero_attn=False):
        self.hybrid = hybrid
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError(
                "hybrid decoder self-attention does not support add_bias_kv, "
                "add_zero_attn or --cross-self-attention")
        return hybrid_self_attention(self, embed_dim, cfg.decoder.attention_heads, cfg,
                                     causal=True)


class HybridTransformerEncoder(TransformerEncoder):
    """fairseq's encoder; the layers in ``hybrid.encoder_layers`` are hybrid."""

    def __init__(self, args, dictionary, embed_tokens, return_fc=False,
                 hybrid: HybridSettings = None):
        self.hybrid = hybrid if hybrid is not None else HybridSettings.from_args(args)
        self.hybrid_layers = self.hybrid.encoder_layers
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        return build_chosen_layer(
            self, self.hybrid_layers, cfg, partial(super().build_encoder_layer, args),
            lambda: HybridTransformerEncoderLayer(cfg, self.hybrid.attention,
                                                  return_fc=self.return_fc))


class HybridTransformerDecoder(TransformerDecoder):
    """fairseq's decoder; the layers in ``hybrid.decoder_layers`` are hybrid."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None, hybrid: HybridSettings = None):
        self.hybrid = hybrid if hybrid is not None else HybridSettings.from_args(args)
        self.hybrid_layers = self.hybrid.decoder_layers
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, args, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        return build_chosen_layer(
            self, self.hybrid_layers, cfg,
            partial(super().build_decoder_layer, args, no_encoder_attn=no_encoder_attn),
            lambda: HybridTransformerDecoderLayer(cfg, self.hybrid.attention,
                                                  no_encoder_attn=no_encoder_attn))


@register_model("transformer_hybrid")
class TransformerHybridModel(TransformerModel):
    """Transformer with hybrid local/global self-attention (Xu et al., 2019)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        # no defaults here: the architecture functions fill them in
        parser.add_argument(
            "--hybrid-mode", choices=HYBRID_MODES,
            help="gate: the paper's gated hybrid (default); concat: [global; local] "
                 "and a projection; local: the local pattern alone; gauss-window / "
                 "gauss-center / gauss-both: Gaussian localness baselines (Sperber et "
                 "al. 2018 / Luong et al. 2015 / Yang et al. 2018)")
        parser.add_argument(
            "--hybrid-window", type=int, metavar="M",
            help="m, words on each side of the local window (default 1: window size 3); "
                 "gauss-center uses D = 2m+1 as its fixed window")
        parser.add_argument(
            "--hybrid-encoder-layers", type=str, metavar="SPEC",
            help="1-based encoder layers with hybrid self-attention: all, none, 1-3, "
                 "1,3,5 (default 1-2)")
        parser.add_argument(
            "--hybrid-decoder-layers", type=str, metavar="SPEC",
            help="1-based decoder layers with (causal) hybrid self-attention "
                 "(default none)")
        parser.add_argument(
            "--hybrid-gate-per-head", action="store_true",
            help="one gate scalar per head (and token) instead of one per token")
        add_sentence_init_option(parser, "the hybrid layers' gates, local projections and "
                                         "position predictors")

    @classmethod
    def build_model(cls, args, task):
        transformer_hybrid(args)  # fills defaults for older checkpoints
        HybridSettings.from_args(args)  # validate before building anything
        warn_sentence_init_unread(args, task)
        return super().build_model(args, task)

    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """Stage 2 from a sentence-level transformer (see the module
        docstring): called by the ``document_translation`` task in a new run."""
        return load_sentence_checkpoint(self, path, new=is_hybrid_tensor)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return HybridTransformerEncoder(TransformerConfig.from_namespace(args), src_dict,
                                        embed_tokens, hybrid=HybridSettings.from_args(args))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return HybridTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                        no_encoder_attn=cfg.no_cross_attention,
                                        hybrid=HybridSettings.from_args(args))

    # ------------------------------------------------------ training statistics
    def _gated_layers(self):
        return [(name, m) for name, m in hybrid_attention_modules(self)
                if m.gate_proj is not None]

    def record_context_statistics(self, enabled: bool = True) -> None:
        """Turn the gate recording of every gated hybrid layer on or off
        (``record_gates``); turning it off drops what was recorded."""
        for _, m in self._gated_layers():
            m.record_gates = bool(enabled)
            if not enabled:
                m.last_gate = None
                m.last_gate_padding_mask = None

    def context_statistics(self) -> Dict[str, Tensor]:
        """``gate_enc<N>`` / ``gate_dec<N>`` -> ``[sum, count]`` of the gate of
        Eq. (5) of hybrid layer N over the non-padding tokens of the last
        recorded forward pass (``[0, 0]`` for a layer that was not called);
        empty without gated layers (modes other than ``gate``)."""
        stats: Dict[str, Tensor] = OrderedDict()
        for name, m in self._gated_layers():
            side, _, number = name.partition(".")
            key = (f"gate_{side[:3]}{number}" if side in ("encoder", "decoder")
                   and number.isdigit() else "gate_" + name.replace(".", "_"))
            st = m.gate_statistics()
            stats[key] = st if st is not None else m.gate_proj.weight.new_zeros(
                2, dtype=torch.float64)
        return stats


def hybrid_attention_modules(model):
    """``[(name, module)]`` of every HybridMultiheadAttention in ``model``, named
    ``encoder.N`` / ``decoder.N`` (1-based layer numbers) when they sit in a layer."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, HybridMultiheadAttention):
            parts = name.split(".")
            label = name
            if len(parts) >= 3 and parts[1] == "layers" and parts[2].isdigit():
                label = f"{parts[0]}.{int(parts[2]) + 1}"
            found.append((label, module))
    return found


HYBRID_TENSORS = ("gate_proj", "local_out_proj", "center_predictor", "window_predictor")


def is_hybrid_tensor(name: str) -> bool:
    """A tensor the transformer does not have: a hybrid self-attention's gate
    (Eq. 5), ``concat``'s projection or a Gaussian mode's position predictor."""
    return any(f".self_attn.{part}." in name for part in HYBRID_TENSORS)


@register_model_architecture("transformer_hybrid", "transformer_hybrid")
def transformer_hybrid(args):
    for name, value in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    base_architecture(args)


@register_model_architecture("transformer_hybrid", "transformer_hybrid_wmt_en_de")
def transformer_hybrid_wmt_en_de(args):
    """The paper's setting: base Transformer, gate, m = 1, lowest two encoder layers."""
    args.hybrid_mode = getattr(args, "hybrid_mode", "gate")
    args.hybrid_window = getattr(args, "hybrid_window", 1)
    args.hybrid_encoder_layers = getattr(args, "hybrid_encoder_layers", "1-2")
    args.hybrid_decoder_layers = getattr(args, "hybrid_decoder_layers", "none")
    transformer_hybrid(args)
