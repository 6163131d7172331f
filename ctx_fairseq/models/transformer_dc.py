"""``transformer_dc``: Transformer with the Dual Contextual (DC) module
(Ampomah, McClean & Hawe, 2021). The equations live in
:mod:`ctx_fairseq.modules.dual_context` and :mod:`ctx_fairseq.modules.local_context`.

Options (1-based layer numbers, as in the paper's Table 5):

* ``--dc-encoder-layers SPEC`` / ``--dc-decoder-layers SPEC``: which layers get
  the DC module: ``all``, ``none``, ``N``, ``N-M``, ``N,M,...`` (mixable).
* ``--dc-kernel-size F``: kernel size ``f`` of the Local Context Unit (default 2).

Architectures (all CLI flags override the preset's defaults):

==============================  ==========  ==================================
name                            DC layers   shape
==============================  ==========  ==================================
transformer_dc                  Enc-DC      transformer base (6+6, 512, 8 h)
transformer_dc_dec              Dec-DC      base
transformer_dc_full             Full-DC     base
transformer_dc_wmt_en_de        Enc-DC      base (paper's WMT'14 En-De)
transformer_dc_wmt_en_de_dec    Dec-DC      base
transformer_dc_wmt_en_de_full   Full-DC     base
transformer_dc_iwslt            Enc-DC      4+4 layers, d=256, 4 heads, FFN 1024
transformer_dc_iwslt_dec        Dec-DC      IWSLT shape
transformer_dc_iwslt_full       Full-DC     IWSLT shape
==============================  ==========  ==================================

Parameter counts: :func:`param_count_table` (see ``docs/transformer_dc.md``).

Two-stage training: ``--init-from-sentence-checkpoint PATH`` (read by
``--task document_translation --source-context-size 0`` in a new run, as for
the context models) starts from a stage-1 sentence-level ``transformer`` of the
same shape. Every transformer tensor is loaded: a DC layer's ``self_attn`` is
:class:`~ctx_fairseq.modules.dual_context.DualContextAttention`, whose
``global_attn`` *is* the transformer's self-attention (``h_g`` of Eq. 7 with
``(W_z^g, b_z)`` of Eq. 8 as its output projection), so the checkpoint's
``...self_attn.X`` goes to ``...self_attn.global_attn.X``; every other name
matches (the other layers are fairseq's, the DC layers subclass fairseq's).
New, left at their initialisation: the Local Context Unit (Eq. 6,
``self_attn.local_context``) and ``h_l``'s attention (``self_attn.local_attn``,
whose output projection is ``W_z^l``). So the initial model is the transformer
plus ``h_l``, not the transformer itself. A checkpoint with a tensor of another
shape, or tensors left over (more layers, another model), is an error; the log
lists the loaded (renamed) and the new tensors
(:func:`~ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`).
"""

import argparse
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture

from ctx_fairseq.models._fairseq_utils import (
    add_sentence_init_option,
    build_chosen_layer,
    load_sentence_checkpoint,
    model_shape,
    set_default,
    to_namespace,
    warn_sentence_init_unread,
)
from ctx_fairseq.modules.dual_context import (
    DCTransformerDecoderLayer,
    DCTransformerEncoderLayer,
)
from ctx_fairseq.modules.layer_spec import format_layer_spec, parse_layer_spec

__all__ = [
    "TransformerDCModel",
    "DCTransformerEncoder",
    "DCTransformerDecoder",
    "dc_options",
    "count_parameters",
    "param_count_table",
]

PAPER_TABLE1_PARAMS = {"transformer": 61.2e6, "enc": 73.86e6, "dec": 73.86e6, "full": 86.5e6}




def _check_kernel_size(value) -> int:
    try:
        f = int(value)
        ok = f >= 1 and float(value) == f and not isinstance(value, bool)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"--dc-kernel-size: expected a positive integer, got {value!r}")
    return f


def dc_options(args) -> Tuple[Tuple[int, ...], Tuple[int, ...], int]:
    """Validated ``(encoder DC layers, decoder DC layers, kernel size)``, layers
    0-based. Raises ``ValueError`` naming the bad option."""
    enc = parse_layer_spec(getattr(args, "dc_encoder_layers", "all"),
                           int(args.encoder_layers), "--dc-encoder-layers")
    dec = parse_layer_spec(getattr(args, "dc_decoder_layers", "none"),
                           int(args.decoder_layers), "--dc-decoder-layers")
    return enc, dec, _check_kernel_size(getattr(args, "dc_kernel_size", 2))


class DCTransformerEncoder(TransformerEncoderBase):
    """Transformer encoder whose layers in ``dc_layers`` (0-based) are
    :class:`DCTransformerEncoderLayer`; the others are fairseq's layers."""

    def __init__(self, cfg, dictionary, embed_tokens, dc_layers: Sequence[int] = (),
                 dc_kernel_size: int = 2, return_fc: bool = False):
        # set before the base __init__, which calls build_encoder_layer per layer
        self.dc_layers = tuple(sorted(dc_layers))
        self.dc_kernel_size = dc_kernel_size
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        return build_chosen_layer(
            self, self.dc_layers, cfg, partial(super().build_encoder_layer, cfg),
            lambda: DCTransformerEncoderLayer(cfg, dc_kernel_size=self.dc_kernel_size,
                                              return_fc=self.return_fc))


class DCTransformerDecoder(TransformerDecoderBase):
    """Transformer decoder whose layers in ``dc_layers`` (0-based) are causal
    :class:`DCTransformerDecoderLayer` (incremental decoding supported)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn: bool = False,
                 output_projection=None, dc_layers: Sequence[int] = (),
                 dc_kernel_size: int = 2):
        self.dc_layers = tuple(sorted(dc_layers))
        self.dc_kernel_size = dc_kernel_size
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return build_chosen_layer(
            self, self.dc_layers, cfg, partial(super().build_decoder_layer, cfg, no_encoder_attn),
            lambda: DCTransformerDecoderLayer(cfg, no_encoder_attn=no_encoder_attn,
                                              dc_kernel_size=self.dc_kernel_size))




@register_model("transformer_dc")
class TransformerDCModel(TransformerModel):
    """Transformer with Dual Contextual modules (Enc-DC by default)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--dc-encoder-layers", type=str, metavar="SPEC",
            help="encoder layers (1-based) that get the Dual Contextual module: "
                 "'all', 'none', '1-3', '1,3,5' (default of transformer_dc: all)")
        parser.add_argument(
            "--dc-decoder-layers", type=str, metavar="SPEC",
            help="decoder layers (1-based) that get the (causal) Dual Contextual module: "
                 "'all', 'none', '1-3', '1,3,5' (default of transformer_dc: none)")
        parser.add_argument(
            "--dc-kernel-size", type=int, metavar="F",
            help="kernel size f of the Local Context Unit's convolution (default 2)")
        add_sentence_init_option(parser, "the DC layers' Local Context Units and local "
                                         "attentions (h_l)")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        dc_base_architecture(args)
        dc_options(args)  # fail early, with the option's name, on a bad spec
        warn_sentence_init_unread(args, task)
        return super().build_model(args, task)

    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """Stage 2 from a sentence-level transformer (see the module
        docstring): called by the ``document_translation`` task in a new run."""
        return load_sentence_checkpoint(self, path, their_name=transformer_name,
                                        new=is_dc_tensor)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        enc, _, f = dc_options(args)
        return DCTransformerEncoder(cfg, src_dict, embed_tokens, dc_layers=enc, dc_kernel_size=f)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        _, dec, f = dc_options(args)
        return DCTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                    no_encoder_attn=cfg.no_cross_attention,
                                    dc_layers=dec, dc_kernel_size=f)


def transformer_name(name: str) -> str:
    """The sentence-level transformer's name for this model's tensor ``name``:
    a DC layer's ``self_attn.global_attn`` is the transformer's ``self_attn``."""
    return name.replace(".self_attn.global_attn.", ".self_attn.")


def is_dc_tensor(name: str) -> bool:
    """A tensor the transformer does not have: a DC layer's Local Context Unit
    (Eq. 6) or ``h_l``'s attention (Eq. 7, with ``W_z^l`` of Eq. 8)."""
    return ".self_attn.local_context." in name or ".self_attn.local_attn." in name


# --------------------------------------------------------------------------- presets


_default = set_default


def dc_base_architecture(args):
    _default(args, "dc_encoder_layers", "all")
    _default(args, "dc_decoder_layers", "none")
    _default(args, "dc_kernel_size", 2)
    base_architecture(args)


def _iwslt_shape(args):
    # paper Sec. 5.2: 4+4 layers, hidden size 256, 4 heads (FFN size not given: 4 d)
    model_shape(args, layers=4, embed_dim=256, ffn_embed_dim=1024, attention_heads=4)


def _enc(args):
    _default(args, "dc_encoder_layers", "all")
    _default(args, "dc_decoder_layers", "none")


def _dec(args):
    _default(args, "dc_encoder_layers", "none")
    _default(args, "dc_decoder_layers", "all")


def _full(args):
    _default(args, "dc_encoder_layers", "all")
    _default(args, "dc_decoder_layers", "all")


def _register(name, *steps):
    def arch(args):
        for step in steps:
            step(args)
        dc_base_architecture(args)

    arch.__name__ = name
    arch.__doc__ = f"Architecture preset {name}."
    register_model_architecture("transformer_dc", name)(arch)
    return arch


transformer_dc = _register("transformer_dc", _enc)
transformer_dc_dec = _register("transformer_dc_dec", _dec)
transformer_dc_full = _register("transformer_dc_full", _full)
transformer_dc_wmt_en_de = _register("transformer_dc_wmt_en_de", _enc)
transformer_dc_wmt_en_de_dec = _register("transformer_dc_wmt_en_de_dec", _dec)
transformer_dc_wmt_en_de_full = _register("transformer_dc_wmt_en_de_full", _full)
transformer_dc_iwslt = _register("transformer_dc_iwslt", _enc, _iwslt_shape)
transformer_dc_iwslt_dec = _register("transformer_dc_iwslt_dec", _dec, _iwslt_shape)
transformer_dc_iwslt_full = _register("transformer_dc_iwslt_full", _full, _iwslt_shape)


# --------------------------------------------------------------------------- parameters


def _dummy_dictionary(vocab_size: int):
    from fairseq.data import Dictionary

    d = Dictionary()  # 4 specials
    for i in range(max(0, vocab_size - len(d))):
        d.add_symbol(f"w{i}")
    return d


def count_parameters(arch: str, vocab_size: int = 32768, share_all_embeddings: bool = True,
                     extra: Optional[List[str]] = None) -> int:
    """Trainable parameters of ``arch`` built with a joined vocabulary of
    ``vocab_size`` types (specials included), as fairseq would build it."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = options.get_training_parser()
    argv = ["/dev/null", "--arch", arch, "--task", "translation"]
    if share_all_embeddings:
        argv.append("--share-all-embeddings")
    args = options.parse_args_and_arch(parser, argv + list(extra or []))  # applies the preset
    dictionary = _dummy_dictionary(vocab_size)

    class _Task:
        source_dictionary = dictionary
        target_dictionary = dictionary

    model = ARCH_MODEL_REGISTRY[arch].build_model(args, _Task())
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def param_count_table(vocab_size: int = 32768) -> str:
    """Markdown table: our parameter counts at the paper's WMT setting (base,
    f=2, shared joined vocabulary) beside Table 1 of the paper."""
    rows = [("Transformer", "transformer_wmt_en_de", PAPER_TABLE1_PARAMS["transformer"]),
            ("Enc-DC", "transformer_dc_wmt_en_de", PAPER_TABLE1_PARAMS["enc"]),
            ("Dec-DC", "transformer_dc_wmt_en_de_dec", PAPER_TABLE1_PARAMS["dec"]),
            ("Full-DC", "transformer_dc_wmt_en_de_full", PAPER_TABLE1_PARAMS["full"])]
    counts: Dict[str, int] = {name: count_parameters(arch, vocab_size) for name, arch, _ in rows}
    base = counts["Transformer"]
    out = [f"vocabulary: {vocab_size} joined types, --share-all-embeddings, f=2",
           "",
           "| model | arch | ours | ours - Transformer | paper (Table 1) | paper - Transformer |",
           "|---|---|---:|---:|---:|---:|"]
    for name, arch, paper in rows:
        n = counts[name]
        out.append(f"| {name} | `{arch}` | {n / 1e6:.2f}M ({n:,}) | {(n - base) / 1e6:+.2f}M | "
                   f"{paper / 1e6:.2f}M | {(paper - PAPER_TABLE1_PARAMS['transformer']) / 1e6:+.2f}M |")
    return "\n".join(out)


def params_cli_main(argv: Optional[List[str]] = None):
    """``ctx-dc-params [--vocab-size N]``: print :func:`param_count_table`."""
    p = argparse.ArgumentParser(description="Parameter counts of Enc/Dec/Full-DC at the "
                                            "paper's WMT setting beside Table 1.")
    p.add_argument("--vocab-size", type=int, default=32768,
                   help="joined vocabulary size including fairseq's 4 specials")
    a = p.parse_args(argv)
    if a.vocab_size <= 4:
        p.error(f"--vocab-size must be larger than fairseq's 4 special symbols, got "
                f"{a.vocab_size}")
    print(param_count_table(a.vocab_size))


def describe(model) -> Dict[str, str]:
    """1-based DC layer specs of a built model (for logs and tests)."""
    return {
        "encoder": format_layer_spec(getattr(model.encoder, "dc_layers", ()),
                                     len(model.encoder.layers)),
        "decoder": format_layer_spec(getattr(model.decoder, "dc_layers", ()),
                                     len(model.decoder.layers)),
    }
