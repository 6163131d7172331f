"""What the plugin's models share (not a model file: fairseq's
``import_models`` skips modules whose name starts with an underscore): layer
wrapping, architecture presets, checkpoint conversion and two-stage
initialisation, plain (non-beamable) attention, the forward pass with context
inputs (:func:`encode_and_decode`, :class:`SourceContextModel`). The
ctx-demo and ctx-bench hooks are the tools' (:mod:`ctx_fairseq.cli.arch_hooks`)."""

import argparse
import logging
from contextlib import contextmanager
from typing import Callable, Dict, List, Optional

import torch

from fairseq.distributed import fsdp_wrap
from fairseq.modules import MultiheadAttention
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from ctx_fairseq.data.contract import ContextContract
from ctx_fairseq.data.vocabulary_rows import extend_vocabulary

logger = logging.getLogger(__name__)


def wrap_layer(layer, cfg):
    """Activation checkpointing / FSDP wrapping exactly as fairseq's own
    ``build_encoder_layer`` / ``build_decoder_layer`` apply them."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def layer_being_built(part) -> int:
    """The 0-based index of the layer a fairseq encoder or decoder is building:
    its ``__init__`` calls ``build_encoder_layer`` / ``build_decoder_layer``
    once per layer, in order, so an override that replaces some layers counts
    the calls (on the module, from 0 for each new one)."""
    index = getattr(part, "_layers_built", 0)
    part._layers_built = index + 1
    return index


def build_chosen_layer(part, chosen, cfg, fairseq_layer: Callable[[], torch.nn.Module],
                       own_layer: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The layer a fairseq encoder or decoder (``part``) builds next, for a
    model that replaces only the layers whose 0-based index is in ``chosen``
    (the Dual Contextual and hybrid models): ``own_layer()`` wrapped as
    fairseq wraps its own layers (:func:`wrap_layer` with ``cfg``) for a chosen
    index (:func:`layer_being_built`), fairseq's ``fairseq_layer()`` otherwise."""
    if layer_being_built(part) not in chosen:
        return fairseq_layer()
    return wrap_layer(own_layer(), cfg)


def set_default(args, name, value):
    """Architecture presets: set ``args.name`` unless the command line did."""
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def model_shape(args, layers: int, embed_dim: int, ffn_embed_dim: int, attention_heads: int):
    """Architecture presets: the same shape for the encoder and the decoder
    (each option set unless the command line did)."""
    for side in ("encoder", "decoder"):
        set_default(args, f"{side}_layers", layers)
        set_default(args, f"{side}_embed_dim", embed_dim)
        set_default(args, f"{side}_ffn_embed_dim", ffn_embed_dim)
        set_default(args, f"{side}_attention_heads", attention_heads)


def tiny_shape(args):
    """The ``*_tiny`` presets (toy data, tests): 2 layers, d=64, 4 heads, FFN 128."""
    model_shape(args, layers=2, embed_dim=64, ffn_embed_dim=128, attention_heads=4)


def preset(arch: str) -> argparse.Namespace:
    """The options the architecture preset ``arch`` sets (on an empty namespace)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    ns = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](ns)
    return ns


def to_namespace(args):
    """Checkpoints may hand a model its config as an omegaconf ``DictConfig``;
    ``TransformerConfig.from_namespace`` keeps the plugin's own (unknown) keys
    only from an ``argparse.Namespace``, so convert it."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    return args


def load_sentence_checkpoint(model, path: str, their_name: Optional[Callable[[str], str]] = None,
                             new: Optional[Callable[[str], bool]] = None
                             ) -> Dict[str, List[str]]:
    """Copy every parameter/buffer whose name and shape match from a
    sentence-level fairseq checkpoint; returns (and logs) the names
    ``loaded``, ``fresh`` (not in the checkpoint) and ``unused`` (in the
    checkpoint only). A name present in both with another shape is an
    error (a different vocabulary or model size).

    ``their_name`` maps a name of ``model`` to the checkpoint's name for it
    (where the model keeps a transformer module under another name, e.g. the
    Dual Contextual module's ``self_attn.global_attn`` is the transformer's
    ``self_attn``). ``new``, for a model that extends the transformer, tells
    its own new tensors (``new(name)``); then the checkpoint must be a
    transformer of the same shape: every tensor of the model but the new ones
    found there, and every tensor of the checkpoint loaded (fewer or more
    layers, another model: an error naming the tensors)."""
    import os

    from fairseq import checkpoint_utils

    if not os.path.exists(path):
        raise FileNotFoundError(f"--init-from-sentence-checkpoint {path}: no such file")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    theirs = state.get("model")
    if not isinstance(theirs, dict):
        raise ValueError(f"--init-from-sentence-checkpoint {path}: not a fairseq checkpoint "
                         "(no 'model' state)")
    extend_vocabulary(model, theirs)  # a dictionary without the task's added symbols
    rename = their_name or (lambda n: n)
    own = model.state_dict()
    loaded, fresh, source = [], [], {}
    for name, value in own.items():
        theirs_name = rename(name)
        if theirs_name not in theirs:
            fresh.append(name)
        elif tuple(theirs[theirs_name].shape) != tuple(value.shape):
            shown = name if theirs_name == name else f"{name} (there {theirs_name})"
            raise ValueError(
                f"--init-from-sentence-checkpoint {path}: {shown} has shape "
                f"{tuple(theirs[theirs_name].shape)} there but {tuple(value.shape)} here; "
                "expected the same vocabulary (data-bin) and model dimensions")
        else:
            loaded.append(name)
            source[name] = theirs_name
    if not any(n.startswith("encoder.layers.") for n in loaded):
        raise ValueError(f"--init-from-sentence-checkpoint {path}: no encoder layer matches; "
                         "expected a sentence-level transformer checkpoint")
    used = set(source.values())
    unused = sorted(n for n in theirs if n not in used)
    if new is not None:
        missing = [n for n in fresh if not new(n)]
        for names, what in ((missing, "of this model's transformer tensors are not in the "
                                      "checkpoint"),
                            (unused, "tensors of the checkpoint have no place in this model")):
            if names:
                raise ValueError(
                    f"--init-from-sentence-checkpoint {path}: {len(names)} {what} "
                    f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}); expected a "
                    "sentence-level transformer of the same shape (layers, dimensions, "
                    "--share-all-embeddings / --share-decoder-input-output-embed)")
    with torch.no_grad():
        for name in loaded:
            own[name].copy_(theirs[source[name]].to(own[name].dtype))
    n_loaded = sum(own[n].numel() for n in loaded)
    n_fresh = sum(own[n].numel() for n in fresh)
    renamed = [f"{source[n]} -> {n}" for n in loaded if source[n] != n]
    logger.info(f"init from sentence-level checkpoint {path}: loaded {len(loaded)} tensors "
                f"({n_loaded:,} values)"
                + (f", {len(renamed)} under new names: {', '.join(renamed)}" if renamed else "")
                + f"; fresh {len(fresh)} tensors ({n_fresh:,} values): "
                f"{', '.join(fresh) or '-'}; unused from the checkpoint: "
                f"{', '.join(unused) or '-'}")
    return {"loaded": loaded, "fresh": fresh, "unused": unused}


def add_sentence_init_option(parser, what: str, also: str = "",
                             freeze: Optional[str] = None) -> None:
    """``--init-from-sentence-checkpoint`` of a model that extends the
    transformer (``what``: its new parameters, for the help; ``also``: what
    else the option may start from) and, given ``freeze`` (what stage 2 then
    trains), ``--freeze-sentence-level``: the two-stage training options of
    every document-level model, declared once."""
    if freeze is not None:
        parser.add_argument("--freeze-sentence-level", action="store_true",
                            help=f"stage 2 of two-stage training: train only {freeze}")
    parser.add_argument(
        "--init-from-sentence-checkpoint", type=str, metavar="PATH",
        help="start from a stage-1 sentence-level transformer checkpoint of the same shape "
             f"(every transformer parameter loaded; {what} left at their initialisation){also}; "
             "read by --task document_translation in a new run only (not when the run "
             "restores a checkpoint, nor when loading this model's own checkpoints)")


def two_stage_defaults(args) -> None:
    """Architecture presets of a model with both two-stage training options
    (``--init-from-sentence-checkpoint`` and ``--freeze-sentence-level``):
    unless the command line set them, a run starts from scratch and trains
    every parameter."""
    set_default(args, "freeze_sentence_level", False)
    set_default(args, "init_from_sentence_checkpoint", None)


def warn_sentence_init_unread(args, task) -> None:
    """``--init-from-sentence-checkpoint`` is read by the ``document_translation``
    task once the model is built (which knows whether the run restores a
    checkpoint); another task builds the model both for a new run and to load
    its own checkpoints, so it cannot tell: say that it is not read."""
    path = getattr(args, "init_from_sentence_checkpoint", None)
    if path and not hasattr(task, "checkpoint_to_restore"):
        logger.warning(f"--init-from-sentence-checkpoint {path} is not read by --task "
                       f"{type(task).__name__}: train with --task document_translation "
                       "(--source-context-size 0 for a sentence-level model) to start from it")


@contextmanager
def plain_attention(*modules):
    """fairseq's beam search makes every encoder-decoder attention "beamable"
    (``set_beam_size``: key rows are taken as groups of beam copies and one of
    each group is kept). Decoding other rows with the same modules (context or
    memory sentences, one row each) must not do that: inside this block their
    beam size is 1, and it is restored after."""
    saved = []
    for module in modules:
        for m in module.modules():
            if isinstance(m, MultiheadAttention) and getattr(m, "beam_size", 1) != 1:
                saved.append((m, m.beam_size))
                m.beam_size = 1
    try:
        yield
    finally:
        for m, b in saved:
            m.beam_size = b


# ------------------------------------------------------------------ layers


def encode_static(encoder, tokens: Tensor) -> Tensor:
    """The final states (``T x B x C``) of fairseq's encoder pass
    (``TransformerEncoderBase.forward_scriptable``) over ``tokens``, run
    through the encoder's own modules (``forward_embedding``, ``layers``,
    ``layer_norm``) with the padding mask always given. fairseq's pass checks
    whether the batch has padding (``has_pads``: a read back to the host,
    then one per layer) and leaves the mask out where it has none; an
    all-False mask computes the same (tested), without reading anything
    back. For the extra passes of context models (previous sentences)."""
    padding = tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(tokens)
    x = (x * (1 - padding.unsqueeze(-1).type_as(x))).transpose(0, 1)
    for layer in encoder.layers:
        x = layer(x, encoder_padding_mask=padding)
        if isinstance(x, tuple):  # return_fc
            x = x[0]
    if encoder.layer_norm is not None:
        x = encoder.layer_norm(x)
    return x


def decode_static(decoder, prev_output_tokens: Tensor, encoder_out: Tensor,
                  encoder_padding_mask: Tensor) -> Tensor:
    """The features (``B x T x C``, before the output projection) of fairseq's
    teacher-forced decoder pass (``TransformerDecoderBase.
    extract_features_scriptable`` without incremental state or alignment),
    run through the decoder's own modules with the self-attention padding
    mask always given: fairseq's pass checks whether ``prev_output_tokens``
    has padding (a read back to the host) and leaves the mask out where it
    has none; an all-False mask computes the same (tested). For the extra
    passes of context models (previous target sentences)."""
    if decoder.cross_self_attention:
        raise ValueError("decode_static: --cross-self-attention is not supported")
    padding = prev_output_tokens.eq(decoder.padding_idx)
    x = decoder.embed_scale * decoder.embed_tokens(prev_output_tokens)
    if decoder.quant_noise is not None:
        x = decoder.quant_noise(x)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + decoder.embed_positions(prev_output_tokens)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    x = decoder.dropout_module(x).transpose(0, 1)
    future = decoder.buffered_future_mask(x)
    for layer in decoder.layers:
        x, _, _ = layer(x, encoder_out, encoder_padding_mask, None, self_attn_mask=future,
                        self_attn_padding_mask=padding)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x


# ------------------------------------------------------------------ models


def encode_and_decode(model, src_tokens, src_lengths, prev_output_tokens,
                      return_all_hiddens: bool, features_only: bool,
                      alignment_layer: Optional[int], alignment_heads: Optional[int],
                      **context):
    """fairseq's ``TransformerModel.forward``, with the context inputs
    (``context``: ``src_ctx_tokens``, ...) handed to the encoder."""
    encoder_out = model.encoder(src_tokens, src_lengths=src_lengths,
                                return_all_hiddens=return_all_hiddens, **context)
    return model.decoder(prev_output_tokens, encoder_out=encoder_out,
                         features_only=features_only, alignment_layer=alignment_layer,
                         alignment_heads=alignment_heads, src_lengths=src_lengths,
                         return_all_hiddens=return_all_hiddens)


class SourceContextModel:
    """A ``TransformerModel`` whose encoder reads the previous source
    sentences (``src_ctx_tokens``, ``src_ctx_lengths`` from the
    ``document_translation`` task) and whose decoder is given the encoder's
    output only (put before ``TransformerModel`` in the bases)."""

    context_contract = ContextContract(inputs=("src_ctx_tokens", "src_ctx_lengths"))

    def forward(self, src_tokens, src_lengths, prev_output_tokens,
                src_ctx_tokens: Optional[Tensor] = None,
                src_ctx_lengths: Optional[Tensor] = None, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, **unused):
        return encode_and_decode(self, src_tokens, src_lengths, prev_output_tokens,
                                 return_all_hiddens, features_only, alignment_layer,
                                 alignment_heads, src_ctx_tokens=src_ctx_tokens,
                                 src_ctx_lengths=src_ctx_lengths)


