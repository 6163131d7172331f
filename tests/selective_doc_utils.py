"""Helpers of the transformer_selective_doc tests (tests/test_selective_doc*.py
and tests/test_length_buckets.py): tiny models built as fairseq builds them,
synthetic documents, their datasets and collated batches."""

import os
import random

import numpy as np
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)
from fairseq import options, tasks
from fairseq.data import LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY

from ctx_fairseq.data.contract import ContextSpec
from ctx_fairseq.modules.sentence_cache import SentenceStateCache
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    build_tiny_model,
    document_dataset,
)

VOCAB = 40

VOCAB = 40
ARCH = "transformer_selective_doc"


# --------------------------------------------------------------------------- helpers


class _Task:
    """What build_model reads from a document_translation task: its context
    options (``ctx_fairseq.data.contract.task_options``) and dictionaries."""

    def __init__(self, d, mode="online", target_context=0, left_pad_source=True, memory=True):
        self.source_dictionary = self.target_dictionary = d
        self.context_spec = ContextSpec(document_context=mode, document_memory=memory,
                                        target_context_size=target_context,
                                        left_pad_source=left_pad_source)


def build(extra=(), integration="encoder", mode="online", double=True, left_pad_source=True,
          arch=ARCH, cache="default", memory="shared"):
    """A tiny model (2+2 layers, d=32) built as fairseq builds it, dropout off,
    non-trivial biases / LayerNorm parameters. ``memory``: ``--context-memory``
    unless ``extra`` gives it (the tests' default: ``shared``, which needs no
    stage-1 model; the architecture's default is ``frozen``, the paper's).
    ``cache`` (frozen memory): the
    model's default (the model's precision on the CPU), ``"full"`` (the same)
    or ``None`` (no cache)."""
    target_context = 1 if integration == "decoder" else 0
    if memory is not None and "--context-memory" not in extra:
        extra = ["--context-memory", memory, *extra]
    model, d = build_tiny_model(
        arch, ["--context-integration", integration, *extra], vocab=VOCAB,
        task=lambda d: _Task(d, mode, target_context, left_pad_source),
        # as for a checkpoint: the frozen copies, if any
        setup=lambda model: model.finish_setup(None, new_run=False), double=double)
    if cache != "default":
        model.set_memory_cache(SentenceStateCache(1000, dtype=None) if cache == "full" else None)
    return model, d


def corpus(d, doc_sizes, seed=0, lengths=None):
    """Random documents: source sentences of 2-6 words (or ``lengths``) + </s>,
    targets one word longer."""
    rng = random.Random(seed)
    src, tgt, ids = [], [], []
    k = 0
    for doc, n in enumerate(doc_sizes):
        for _ in range(n):
            length = lengths[k] if lengths else rng.randint(2, 6)
            k += 1
            src.append(torch.tensor([rng.randrange(d.nspecial, len(d)) for _ in range(length)]
                                    + [d.eos()]))
            tgt.append(torch.tensor([rng.randrange(d.nspecial, len(d)) for _ in range(length + 1)]
                                    + [d.eos()]))
            ids.append(f"doc{doc}")
    return src, tgt, ids


def dataset(d, data, mode="online", integration="encoder", left_pad_source=True,
            memory_precomputed=False):
    src, tgt, ids = data
    base = LanguagePairDataset(src, np.array([len(s) for s in src]), d, tgt,
                               np.array([len(t) for t in tgt]), d,
                               left_pad_source=left_pad_source, shuffle=False)
    return document_dataset(base, ids, document_context=mode, document_memory=True,
                                  tgt_context_size=1 if integration == "decoder" else 0,
                                  memory_precomputed=memory_precomputed)


def collate(d, data, rows, mode="online", integration="encoder", left_pad_source=True):
    """A batch of sentences ``rows`` with its document memory, collated by
    the task's dataset (``DocumentContextDataset.collate_memory``)."""
    ds = dataset(d, data, mode, integration, left_pad_source)
    return ds.collater([ds[i] for i in rows])


def enc_input(ni):
    return {k: v for k, v in ni.items() if k != "prev_output_tokens"}


def beam_case(model, d, mode, doc_sizes, rows, beam=2, steps=7):
    """A decoder-integration batch for incremental decoding with beam
    reorders: ``(encoder_out, prev, order)``, the encoder's output of
    ``rows`` of random documents ``doc_sizes`` repeated ``beam`` times,
    random previous tokens (``</s>`` first) and a reorder within each
    sentence's beam that duplicates hypotheses."""
    ni = collate(d, corpus(d, doc_sizes), rows, mode, "decoder")["net_input"]
    bsz = ni["src_tokens"].size(0)
    g = torch.Generator().manual_seed(4)
    prev = torch.randint(d.nspecial, len(d), (bsz * beam, steps), generator=g)
    prev[:, 0] = d.eos()
    order = torch.tensor([1, 1, 2, 3, 5, 4, 6, 6, 9, 8])
    with torch.no_grad():
        enc = model.encoder(**enc_input(ni))
        enc = model.encoder.reorder_encoder_out(enc, torch.arange(bsz).repeat_interleave(beam))
    return enc, prev, order


def sentence_level_copy(model, d):
    """A fairseq ``transformer`` holding the same weights (state dict without
    the context layer)."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", "transformer", "--task", "translation", "--dropout", "0",
         *TINY_MODEL_ARGS])
    plain = ARCH_MODEL_REGISTRY["transformer"].build_model(args, _Task(d)).to(
        next(model.parameters()).dtype)
    state = {k: v for k, v in model.state_dict().items()
             if ".context_layer." not in k and ".memory_" not in k}
    plain.load_state_dict(state, strict=True)
    return plain.eval()


def setup_task(data, *extra):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data, "--task", "document_translation", "--arch", ARCH, *TINY_MODEL_ARGS,
         "--share-all-embeddings", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task), cfg


def count_calls(monkeypatch, cls, name="memory_states"):
    calls = []
    real = getattr(cls, name)

    def spy(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, spy)
    return calls


DOC = ["--task", "document_translation", "--document-memory", "--share-all-embeddings"]

#: the CLI runs train from scratch (no stage-1 checkpoint): a shared memory,
#: labelled (the frozen memory of the paper is trained from a stage-1 checkpoint
#: in test_cli_frozen_memory_precomputed)
SHARED = ["--context-memory", "shared"]


def _doc_args(mode, integration, generation=False):
    args = [*DOC[:2], "--document-context", mode, "--document-memory"]
    if integration == "decoder":
        args += ["--target-context-size", "1"]
        if generation:
            args += ["--gold-target-context"]
    return args


def _n_test(toy_bin):
    return sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
