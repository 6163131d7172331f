"""transformer_selective_doc on the accelerator's terms: host reads per
training and incremental step against the transformer's, and half
precision against float32."""


import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)


VOCAB = 40
from selective_doc_utils import (
    VOCAB,
    build,
    corpus,
    collate,
    enc_input,
)


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- host reads

#: (integration, model options) -> host reads allowed beyond the transformer's, per
#: batch: a shared decoder memory decodes the memory's targets in one more fairseq
#: decoder pass (TransformerDecoder.extract_features_scriptable reads
#: prev_output_tokens.eq(pad).any() once); a frozen memory, its cache warm, runs no
#: pass and reads nothing (its keys are the collater's, on the host)
HOST_READ_CONFIGS = {
    "enc-shared": ("encoder", [], 0),
    "enc-shared-sparse-sparse": ("encoder", ["--word-attn", "sparsemax"], 0),
    "enc-flat-sentence": ("encoder", ["--doc-attention", "flat-sentence"], 0),
    "enc-flat-word": ("encoder", ["--doc-attention", "flat-word"], 0),
    "enc-dense": ("encoder", ["--dense-doc-attention"], 0),
    "enc-frozen": ("encoder", ["--context-memory", "frozen"], 0),
    "dec-shared": ("decoder", [], 1),
    "dec-frozen": ("decoder", ["--context-memory", "frozen"], 0),
}


def _reads(fn):
    from ctx_fairseq.host_reads import HostReadCounter

    with HostReadCounter() as reads:
        fn()
    return reads.by_op


@pytest.mark.usefixtures("accelerator")  # what a GPU runs: the CPU's shortcuts off
@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("name", list(HOST_READ_CONFIGS))
def test_training_step_host_reads_are_the_transformers(name, mode):
    """One training forward + backward (the second: a frozen memory's cache is
    warm) reads back no more than fairseq's transformer of the same shape on
    the same batch, plus what HOST_READ_CONFIGS allows per batch: the context
    layer itself reads nothing (static shapes, the collater's index tensors)."""
    from fairseq_cli_utils import build_tiny_model

    integration, extra, allowed = HOST_READ_CONFIGS[name]
    model, d = build(extra, integration=integration, mode=mode, double=False)
    plain, _ = build_tiny_model("transformer", vocab=VOCAB, double=False)
    data = corpus(d, [5, 4, 2])
    ni = collate(d, data, [1, 2, 3, 4, 6, 7, 9, 10], mode, integration)["net_input"]
    plain_in = {k: ni[k] for k in ("src_tokens", "src_lengths", "prev_output_tokens")}

    def step(m, inputs):
        m.train()
        m.zero_grad()
        m(**inputs)[0].float().sin().sum().backward()

    # the selected sentences' list: one read (its size per width class) per
    # hierarchical context layer (issue 36)
    pairs = sum(1 for m in model.modules() if getattr(m, "attention", None) == "hierarchical")
    step(model, ni)  # warm: a frozen memory's cache misses
    got = _reads(lambda: step(model, ni))
    ref = _reads(lambda: step(plain, plain_in))
    assert got["tolist"] == pairs and not got["nonzero"], (got, pairs)
    assert sum(got.values()) <= sum(ref.values()) + allowed + pairs, (got, ref)
    assert not {"unique", "bool_index", "masked_select", "bincount"} & set(got), got


@pytest.mark.usefixtures("accelerator")  # what a GPU runs: the CPU's shortcuts off
@pytest.mark.parametrize("extra", [[], ["--word-attn", "sparsemax"],
                                   ["--doc-attention", "flat-word"],
                                   ["--context-memory", "frozen"]],
                         ids=lambda e: "-".join(e) or "default")
def test_incremental_step_host_reads_are_the_transformers(extra):
    """Decoder integration, incremental decoding: after the first step (which
    computes the memory), a step reads back exactly what the transformer's
    step reads; a beam reorder adds nothing."""
    from fairseq_cli_utils import build_tiny_model

    model, d = build(extra, integration="decoder", mode="online", double=False)
    plain, _ = build_tiny_model("transformer", vocab=VOCAB, double=False)
    data = corpus(d, [4, 3])
    ni = collate(d, data, [1, 2, 3, 5, 6], "online", "decoder")["net_input"]
    prev = ni["prev_output_tokens"][:, :4]
    counts = []
    for m, inputs in ((model, enc_input(ni)),
                      (plain, {k: ni[k] for k in ("src_tokens", "src_lengths")})):
        per_step = []
        with torch.no_grad():
            enc = m.encoder(**inputs)
            state = {}
            for t in range(prev.size(1)):
                if t == 2:
                    order = torch.tensor([1, 0, 2, 4, 3])
                    m.decoder.reorder_incremental_state_scripting(state, order)
                    enc = m.encoder.reorder_encoder_out(enc, order)
                per_step.append(sum(_reads(lambda: m.decoder(
                    prev[:, :t + 1], enc, incremental_state=state)).values()))
        counts.append(per_step)
    (ours, ref) = counts
    assert ours[1:] == ref[1:], counts


# --------------------------------------------------------------------------- half precision


@pytest.mark.parametrize("extra", [[], ["--context-memory", "frozen"]], ids=["shared", "frozen"])
@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_half_precision_model_matches_float32(integration, extra):
    """``model.half()`` (``--fp16``) on a 30-sentence document with queries
    without context: the logits match float32 within 1e-2 (scale ~3), a
    backward gives finite gradients, and a frozen memory is cached in float16,
    the model's precision (cached == uncached)."""
    model, d = build(extra, integration=integration, double=False)
    data = corpus(d, [30, 3])
    ni = collate(d, data, [0, 1, 5, 29, 30, 32], "online", integration)["net_input"]
    with torch.no_grad():
        ref = model(**ni)[0]
    model.clear_memory_cache()
    model.half()
    with torch.no_grad():
        uncached = None
        if model.memory_cache is not None:
            cache = model.memory_cache
            model.set_memory_cache(None)
            uncached = model(**ni)[0]
            model.set_memory_cache(cache)
        half = model(**ni)[0]
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    assert (half.float() - ref).abs().max() < 1e-2
    if uncached is not None:
        # the cache encodes its misses deduplicated, sorted by length and in
        # chunks, the uncached path the batch's memory as collated: GEMMs of
        # other row counts, whose float16 results may differ in the last bit
        # with the CPU's kernels; both within float16's accuracy of float32
        assert (half.float() - uncached.float()).abs().max() < 1e-2
        assert {t.dtype for e in model.memory_cache.store.values() for t in e} == {torch.float16}
    model.train()
    model(**ni)[0].float().logsumexp(-1).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
