"""Small helpers every plugin model shares (not a model file: fairseq's
``import_models`` skips modules whose name starts with an underscore)."""

import argparse

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper


def wrap_layer(layer, cfg):
    """Activation checkpointing / FSDP wrapping exactly as fairseq's own
    ``build_encoder_layer`` / ``build_decoder_layer`` apply them."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def to_namespace(args):
    """Checkpoints may hand a model its config as an omegaconf ``DictConfig``;
    ``TransformerConfig.from_namespace`` keeps the plugin's own (unknown) keys
    only from an ``argparse.Namespace``, so convert it."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    return args
