"""transformer_selective_doc (Maruf et al. 2019, selective attention over the
whole document): the fairseq CLIs for every attention variant and both
integrations, incremental decoding with beam reorder (memory computed once),
padding invariance, visibility through the model, the no-context bypass,
dense == selective, two-stage training with a frozen memory, the frozen
memory's cache (same outputs, computed once, shared, emptied on loading,
``--memory-precomputed``, a 300-sentence document in small batches),
query-encoding reuse, empty memories, clear errors and fairseq-interactive."""

import os
import random

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)
from fairseq import checkpoint_utils, options, tasks
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerEncoderBase

from ctx_fairseq.data.contract import ContextSpec
from ctx_fairseq.data.document_dataset import DocumentContextDataset
from ctx_fairseq.data.batching import memory_batches
from ctx_fairseq.models.transformer_selective_doc.decoder import SelectiveDocDecoder
from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder
from ctx_fairseq.modules.sentence_cache import SentenceStateCache
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    build_tiny_model,
    decode_with_reorder,
    document_dataset,
    hypotheses,
    interactive,
    loaded_and_fresh,
    train_and_generate,
    write_two_documents,
)

VOCAB = 40
ARCH = "transformer_selective_doc"


pytestmark = pytest.mark.usefixtures("one_thread")


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


# --------------------------------------------------------------------------- fairseq CLIs

DOC = ["--task", "document_translation", "--document-memory", "--share-all-embeddings"]

#: the CLI runs train from scratch (no stage-1 checkpoint): a shared memory,
#: labelled (the frozen memory of the paper is trained from a stage-1 checkpoint
#: in test_cli_frozen_memory_precomputed)
SHARED = ["--context-memory", "shared"]

CLI_CONFIGS = {
    # name: (integration, online|offline, model options)
    "enc-online-sparse-soft": ("encoder", "online", ["--word-attn", "softmax"]),
    "enc-offline-sparse-sparse": ("encoder", "offline", ["--word-attn", "sparsemax"]),
    "enc-online-flat-sentence": ("encoder", "online", ["--doc-attention", "flat-sentence"]),
    "enc-offline-flat-word": ("encoder", "offline", ["--doc-attention", "flat-word"]),
    "dec-offline-sparse-soft": ("decoder", "offline", ["--word-attn", "softmax"]),
    "dec-online-sparse-sparse": ("decoder", "online", ["--word-attn", "sparsemax"]),
    "dec-offline-flat-sentence": ("decoder", "offline", ["--doc-attention", "flat-sentence"]),
    "dec-online-flat-word": ("decoder", "online", ["--doc-attention", "flat-word"]),
}


def _doc_args(mode, integration, generation=False):
    args = [*DOC[:2], "--document-context", mode, "--document-memory"]
    if integration == "decoder":
        args += ["--target-context-size", "1"]
        if generation:
            args += ["--gold-target-context"]
    return args


@pytest.fixture(scope="module")
def cli_run(toy_bin, tmp_path_factory):
    """Train a configuration of CLI_CONFIGS for 2 updates and beam-search the
    test set (each at most once per module)."""
    runs = {}

    def run(name):
        if name not in runs:
            integration, mode, opts = CLI_CONFIGS[name]
            save = str(tmp_path_factory.mktemp(name))
            out = train_and_generate(
                toy_bin, save, ARCH, max_update=2,
                extra=[*_doc_args(mode, integration), "--share-all-embeddings",
                       "--context-integration", integration, *SHARED, *opts],
                gen_extra=_doc_args(mode, integration, generation=True))
            runs[name] = (os.path.join(save, "checkpoint_last.pt"), out)
        return runs[name]

    return run


def _n_test(toy_bin):
    return sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))


@pytest.mark.parametrize("name", list(CLI_CONFIGS))
def test_cli_train_and_generate(cli_run, toy_bin, name):
    integration, mode, opts = CLI_CONFIGS[name]
    ckpt, out = cli_run(name)
    ids = sorted(int(line.split("\t")[0][2:]) for line in out.splitlines()
                 if line.startswith("H-"))
    assert ids == list(range(_n_test(toy_bin)))  # every test sentence, once
    assert len(hypotheses(out)) == _n_test(toy_bin)
    state = torch.load(ckpt, weights_only=True)
    keys = state["model"].keys()
    side = "encoder" if integration == "encoder" else "decoder"
    other = "decoder" if integration == "encoder" else "encoder"
    assert any(k.startswith(f"{side}.context_layer.context_attn.") for k in keys)
    assert not any(k.startswith(f"{other}.context_layer.") for k in keys)
    assert not any(".memory_" in k for k in keys)  # shared memory: no frozen copies
    margs = state["cfg"]["model"]
    assert margs.context_integration == integration and margs.document_context_mode == mode
    attn = dict(zip(opts[::2], opts[1::2]))
    assert margs.doc_attention == attn.get("--doc-attention", "hierarchical")
    assert margs.word_attn == attn.get("--word-attn", "softmax")


# --------------------------------------------------------------------------- incremental decoding

DEC_VARIANTS = [[], ["--word-attn", "sparsemax"], ["--doc-attention", "flat-sentence"],
                ["--doc-attention", "flat-word"], ["--context-memory", "frozen"]]


@pytest.mark.parametrize("extra", DEC_VARIANTS, ids=lambda e: "-".join(e) or "default")
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_incremental_equals_full_forward_with_beam_reorder(extra, mode, monkeypatch):
    model, d = build(extra, integration="decoder", mode=mode)
    data = corpus(d, [4, 3])
    ni = collate(d, data, [1, 2, 3, 5, 6], mode, "decoder")["net_input"]
    bsz, beam, split = ni["src_tokens"].size(0), 2, 3
    enc_calls = count_calls(monkeypatch, SelectiveDocEncoder)
    dec_calls = count_calls(monkeypatch, SelectiveDocDecoder)
    g = torch.Generator().manual_seed(4)
    prev = torch.randint(d.nspecial, len(d), (bsz * beam, 7), generator=g)
    prev[:, 0] = d.eos()
    # beam search reorders within each sentence's beam (and duplicates hypotheses)
    order = torch.tensor([1, 1, 2, 3, 5, 4, 6, 6, 9, 8])
    with torch.no_grad():
        enc = model.encoder(**enc_input(ni))
        enc = model.encoder.reorder_encoder_out(enc, torch.arange(bsz).repeat_interleave(beam))
        steps, prev2, enc2 = decode_with_reorder(model, enc, prev, split, order)
        assert (len(enc_calls), len(dec_calls)) == (1, 1)  # the memory: once per batch
        full1, _ = model.decoder(prev, enc)
        full2, _ = model.decoder(prev2, enc2)
    assert steps.dtype == torch.float64
    # float64 throughout (ctx_fairseq.compat keeps fairseq's softmax in float64)
    assert (steps[:, :split] - full1[:, :split]).abs().max() < 1e-10
    assert (steps[:, split:] - full2[:, split:]).abs().max() < 1e-10
    assert (full1[:, split:] - full2[:, split:]).abs().max() > 1e-3  # the reorder mattered
    # the queries follow the beam, the memory (per document) does not
    assert torch.equal(enc2["query_doc"][0], enc["query_doc"][0][order])
    assert enc2["mem_encoder_out"][0] is enc["mem_encoder_out"][0]


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_a_query_window_follows_the_beam_in_incremental_decoding(mode, monkeypatch):
    """Decoder integration with per-query windows (``query_window``: a scored
    context size or a sampled one): step by step equals the full forward
    after beam reorders, the windows follow the beam, and they change what
    the queries see."""
    model, d = build([], integration="decoder", mode=mode)
    data = corpus(d, [4, 3])
    ni = collate(d, data, [1, 2, 3, 5, 6], mode, "decoder")["net_input"]
    bsz, beam, split = ni["src_tokens"].size(0), 2, 3
    g = torch.Generator().manual_seed(4)
    prev = torch.randint(d.nspecial, len(d), (bsz * beam, 7), generator=g)
    prev[:, 0] = d.eos()
    order = torch.tensor([1, 1, 2, 3, 5, 4, 6, 6, 9, 8])
    windowed = dict(ni, query_window=torch.tensor([0, 1, 2, 1, 0]))
    with torch.no_grad():
        outs = {}
        for name, inputs in (("whole", ni), ("window", windowed)):
            enc = model.encoder(**enc_input(inputs))
            enc = model.encoder.reorder_encoder_out(enc, torch.arange(bsz).repeat_interleave(beam))
            steps, prev2, enc2 = decode_with_reorder(model, enc, prev, split, order)
            full1, _ = model.decoder(prev, enc)
            full2, _ = model.decoder(prev2, enc2)
            assert (steps[:, :split] - full1[:, :split]).abs().max() < 1e-6
            assert (steps[:, split:] - full2[:, split:]).abs().max() < 1e-6
            outs[name] = full1
            if name == "window":
                assert torch.equal(enc2["query_window"][0], enc["query_window"][0][order])
    assert (outs["whole"] - outs["window"]).abs().max() > 1e-3


@pytest.mark.parametrize("extra", [[], ["--context-memory", "frozen"]],
                         ids=["shared", "frozen"])
@pytest.mark.parametrize("docs", [[4, 3], [3, 3]], ids=["odd-memory", "even-memory"])
def test_beam_search_does_not_make_the_memory_beamable(extra, docs):
    """fairseq's beam search sets the decoder's source attentions "beamable"
    (set_beam_size: key rows read as beam groups). The memory's target
    sentences are decoded with the same layers, one row per sentence: their
    states must not depend on the beam size (with an odd number of rows it
    used to fail, with an even number it gave wrong states silently)."""
    model, d = build(extra, integration="decoder", double=False)
    data = corpus(d, docs)
    n = sum(docs)
    ni = collate(d, data, list(range(n)), "offline", "decoder")["net_input"]
    with torch.no_grad():
        enc = model.encoder(**enc_input(ni))
        ref = model.decoder.memory_states(enc)
        model.decoder.set_beam_size(2)
        try:
            got = model.decoder.memory_states(enc)
        finally:
            model.decoder.set_beam_size(1)
    assert ref[0].size(0) == n
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    beamable = [m for m in model.decoder.modules() if getattr(m, "beam_size", 1) != 1]
    assert not beamable  # restored


def test_beam_search_computes_the_memory_once_per_batch(monkeypatch):
    from fairseq.sequence_generator import SequenceGenerator

    model, d = build(integration="decoder", double=False)
    data = corpus(d, [4, 3])
    sample = collate(d, data, list(range(7)), "online", "decoder")
    enc_calls = count_calls(monkeypatch, SelectiveDocEncoder)
    dec_calls = count_calls(monkeypatch, SelectiveDocDecoder)
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=6, min_len=2)
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    assert len(hyps) == 7 and all(len(h) == 3 for h in hyps)
    assert (len(enc_calls), len(dec_calls)) == (1, 1)


# --------------------------------------------------------------------------- encoder: padding


@pytest.mark.parametrize("extra", [[], ["--context-memory", "frozen"],
                                   ["--doc-attention", "flat-sentence"],
                                   ["--doc-attention", "flat-word"]],
                         ids=lambda e: "-".join(e) or "default")
@pytest.mark.parametrize("left_pad_source", [True, False], ids=["left-pad", "right-pad"])
def test_encoder_output_does_not_depend_on_padding(extra, left_pad_source):
    model, d = build(extra, mode="offline", left_pad_source=left_pad_source)
    # document 0: a long sentence before the short query (position 2); document 1: long ones
    data = corpus(d, [4, 3], lengths=[9, 3, 2, 5, 12, 11, 10])

    def encode(rows):
        batch = collate(d, data, rows, "offline", left_pad_source=left_pad_source)
        ni = batch["net_input"]
        with torch.no_grad():
            out = model.encoder(**enc_input(ni))["encoder_out"][0]
        r = batch["id"].tolist().index(2)
        real = ni["src_tokens"][r].ne(d.pad())
        return out[real, r], tuple(ni["src_tokens"].shape), tuple(ni["mem_src_tokens"].shape)

    alone, src1, mem1 = encode([2])
    in_batch, src2, mem2 = encode([2, 3, 4, 5, 6])
    mixed, src3, mem3 = encode([1, 2, 6])
    # the source and the memory rows are padded differently each time
    assert src1[1] < mem1[1] < src2[1] and mem1 != mem2 and mem3[0] != mem1[0]
    assert (alone - in_batch).abs().max() < 1e-10
    assert (alone - mixed).abs().max() < 1e-10


# --------------------------------------------------------------------------- visibility


def _perturb(ni, row, d, seed, sides):
    """Replace the words of memory row ``row`` (source and/or target side)
    by random words; the query whose own row it is no longer shares it
    (``query_mem_row`` -1), so only the memory changes."""
    ni = {k: v.clone() if torch.is_tensor(v) else v.copy() for k, v in ni.items()}
    keys = {"src": ["mem_src_tokens"], "tgt": ["mem_tgt_tokens", "mem_tgt_prev_tokens"]}
    for side in sides:
        for k in keys[side]:
            t = ni[k][row]
            words = t.ne(d.pad()) & t.ne(d.eos())
            g = torch.Generator().manual_seed(seed)
            new = torch.randint(d.nspecial, len(d), (int(words.sum()),), generator=g)
            assert not torch.equal(new, t[words])
            t[words] = new
    ni["query_mem_row"][ni["query_mem_row"] == row] = -1
    # what the collater derived from the tokens and query_mem_row no longer holds:
    # without it the model derives it from the inputs
    for k in ("mem_state_index", "mem_extra_rows", "mem_src_key", "mem_tgt_key"):
        ni.pop(k, None)
    return ni


def _output(model, ni, integration, r):
    with torch.no_grad():
        if integration == "encoder":
            return model.encoder(**enc_input(ni))["encoder_out"][0][:, r]
        return model(**ni)[0][r]


def _in_support(model, ni, integration, r, row):
    """Whether memory row ``row`` gets attention from query ``r`` (sentence
    weights recorded through ``record_stats``)."""
    part = model.encoder if integration == "encoder" else model.decoder
    part.record_stats = True
    try:
        _output(model, ni, integration, r)
        info = part.last_info
    finally:
        part.record_stats = False
    cols = (info["sent_index"][r] == row).nonzero().flatten()
    return bool(cols.numel()) and bool(info["sent_weights"][r][..., cols].ne(0).any())


@pytest.mark.parametrize("extra", [[], ["--word-attn", "sparsemax"],
                                   ["--doc-attention", "flat-sentence"],
                                   ["--doc-attention", "flat-word"],
                                   ["--context-memory", "frozen"]],
                         ids=lambda e: "-".join(e) or "default")
@pytest.mark.parametrize("integration", ["encoder", "decoder"])
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_visibility_through_the_model(mode, integration, extra):
    """Online: the query (position 1 of document A) sees only position 0; the
    current and later sentences in the memory (there for the batch's
    position-3 query) do not matter. Offline: everything but the current
    sentence matters. Another document never matters."""
    model, d = build(extra, integration=integration, mode=mode)
    data = corpus(d, [5, 3])
    rows = [1, 3, 5, 6] if mode == "online" else [1, 6]
    batch = collate(d, data, rows, mode, integration)
    ni = batch["net_input"]
    r = batch["id"].tolist().index(1)
    sides = ("src",) if integration == "encoder" else ("src", "tgt")
    base = _output(model, ni, integration, r)
    doc = int(ni["query_doc"][r])
    seen = set()
    for row in range(ni["mem_pos"].numel()):
        pos, same_doc = int(ni["mem_pos"][row]), int(ni["mem_doc"][row]) == doc
        diff = (_output(model, _perturb(ni, row, d, 11 + row, sides), integration, r)
                - base).abs().max()
        visible = same_doc and (pos < 1 if mode == "online" else pos != 1)
        if not visible:
            assert diff < 1e-10, (row, pos, same_doc)
        elif mode == "online" or _in_support(model, ni, integration, r, row):
            assert diff > 1e-4, (row, pos)
        seen.add((same_doc, "earlier" if pos < 1 else "current" if pos == 1 else "later"))
    expected = {(True, "earlier"), (True, "current"), (True, "later"), (False, "earlier")}
    assert expected <= seen
    if mode == "offline":  # sparsemax may leave a sentence out; at least one was in the support
        assert any(_in_support(model, ni, integration, r, row)
                   for row in range(ni["mem_pos"].numel())
                   if int(ni["mem_doc"][row]) == doc and int(ni["mem_pos"][row]) != 1)


# --------------------------------------------------------------------------- wiring by hand


def _real_words(tokens, d):
    return tokens.ne(d.pad()) & tokens.ne(d.eos()) & tokens.ne(d.bos())


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_encoder_integration_by_hand(mode):
    """r~ = ContextLayer(r, memory): r and the memory are the sentence-level
    encoder's last-layer states of the query and of each memory sentence (Sec. 3.3)."""
    model, d = build(mode=mode)
    plain = sentence_level_copy(model, d)
    data = corpus(d, [4, 1, 3])
    ni = collate(d, data, [1, 3, 4, 5, 7], mode)["net_input"]
    layer = model.encoder.context_layer
    with torch.no_grad():
        r = plain.encoder(ni["src_tokens"], ni["src_lengths"])["encoder_out"][0]
        mem = plain.encoder(ni["mem_src_tokens"], ni["mem_src_lengths"])["encoder_out"][0]
        words = mem.transpose(0, 1)
        memory = layer.project_memory(words, words, _real_words(ni["mem_src_tokens"], d),
                                      ni["mem_doc"], ni["mem_pos"])
        want, _ = layer(r, memory, ni["query_doc"], ni["query_pos"], mode == "online")
        got = model.encoder(**enc_input(ni))["encoder_out"][0]
    real = ni["src_tokens"].ne(d.pad()).t()
    assert (got - want)[real].abs().max() < 1e-10
    assert (got - r)[real].abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_decoder_integration_by_hand(mode):
    """Queries: the last decoder layer's source-attention output; r: the
    decoder output; memory: the memory targets decoded with teacher forcing
    on their own sources, keys the last layer's source-attention outputs,
    values the output states, one word per real target word (Sec. 3.3, Fig. 3)."""
    model, d = build(integration="decoder", mode=mode)
    plain = sentence_level_copy(model, d)
    data = corpus(d, [4, 1, 3])
    ni = collate(d, data, [1, 3, 4, 5, 7], mode, "decoder")["net_input"]
    layer = model.decoder.context_layer
    seen = []
    hook = plain.decoder.layers[-1].encoder_attn.register_forward_hook(
        lambda mod, args, out: seen.append(out[0]))
    try:
        with torch.no_grad():
            enc = plain.encoder(ni["src_tokens"], ni["src_lengths"])
            r, _ = plain.decoder.extract_features(ni["prev_output_tokens"], enc)
            query = seen[-1]
            mem_enc = plain.encoder(ni["mem_src_tokens"], ni["mem_src_lengths"])
            prev = ni["mem_tgt_prev_tokens"]
            values, _ = plain.decoder.extract_features(prev, mem_enc)
            keys = seen[-1].transpose(0, 1)
            memory = layer.project_memory(keys, values, _real_words(prev, d), ni["mem_doc"],
                                          ni["mem_pos"])
            r_tilde, _ = layer(r.transpose(0, 1), memory, ni["query_doc"], ni["query_pos"],
                               mode == "online", query=query)
            want = plain.decoder.output_layer(r_tilde.transpose(0, 1))
            got, _ = model(**ni)
            ref, _ = plain(ni["src_tokens"], ni["src_lengths"], ni["prev_output_tokens"])
    finally:
        hook.remove()
    real = ni["prev_output_tokens"].ne(d.pad())
    assert (got - want)[real].abs().max() < 1e-10
    assert (got - ref)[real].abs().max() > 1e-3


# --------------------------------------------------------------------------- no context


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_no_visible_context_is_the_sentence_level_model(mode, integration):
    """First sentences (online) and one-sentence documents get exactly the
    output of a fairseq transformer holding the same weights; the others do not."""
    model, d = build(integration=integration, mode=mode)
    plain = sentence_level_copy(model, d)
    data = corpus(d, [4, 1, 3])
    batch = collate(d, data, list(range(8)), mode, integration)
    ni = batch["net_input"]
    with torch.no_grad():
        out, _ = model(**ni)
        ref, _ = plain(ni["src_tokens"], ni["src_lengths"], ni["prev_output_tokens"])
    firsts = {0, 4, 5} if mode == "online" else {4}
    for r, i in enumerate(batch["id"].tolist()):
        real = ni["prev_output_tokens"][r].ne(d.pad())
        diff = (out[r][real] - ref[r][real]).abs().max()
        if i in firsts:
            assert diff < 1e-12, i
        else:
            assert diff > 1e-3, i


@pytest.mark.parametrize("memory", ["shared", "frozen"])
@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_a_batch_with_an_empty_memory(integration, memory, monkeypatch):
    """Online, a batch of first sentences has no memory row at all (e.g.
    ``--batch-size 1`` or fairseq-interactive on a document's first line):
    training and beam search run, outputs are the sentence-level model's."""
    from fairseq.sequence_generator import SequenceGenerator

    model, d = build(["--context-memory", memory], integration=integration)
    plain = sentence_level_copy(model, d)
    data = corpus(d, [4, 3, 1])
    sample = collate(d, data, [0, 4, 7], "online", integration)
    ni = sample["net_input"]
    assert ni["mem_src_tokens"].size(0) == 0
    with torch.no_grad():
        out, _ = model(**ni)
        ref, _ = plain(ni["src_tokens"], ni["src_lengths"], ni["prev_output_tokens"])
    real = ni["prev_output_tokens"].ne(d.pad())
    assert (out - ref)[real].abs().max() < 1e-12
    model.train()
    out, _ = model(**ni)
    out.sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if ".context_layer." in n]
    assert all(g is None or (g == 0).all() for g in grads)
    model.eval()
    gen = SequenceGenerator([model], d, beam_size=2, max_len_b=5)
    with torch.no_grad():
        assert len(gen.generate([model], sample)) == 3


# --------------------------------------------------------------------------- dense == selective


@pytest.mark.parametrize("attn", [["--word-attn", "softmax"], ["--word-attn", "sparsemax"],
                                  ["--sentence-attn", "softmax"]], ids=lambda a: "-".join(a))
@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_dense_doc_attention_equals_the_selective_path(integration, attn):
    model, d = build(attn, integration=integration, mode="offline")
    dense, _ = build([*attn, "--dense-doc-attention"], integration=integration, mode="offline")
    dense.load_state_dict(model.state_dict(), strict=True)
    layer = (model.encoder if integration == "encoder" else model.decoder).context_layer
    dense_layer = (dense.encoder if integration == "encoder" else dense.decoder).context_layer
    assert layer.context_attn.selective and not dense_layer.context_attn.selective
    data = corpus(d, [5, 1, 4])
    ni = collate(d, data, list(range(10)), "offline", integration)["net_input"]
    a, _ = model(**ni)
    b, _ = dense(**ni)
    assert (a - b).abs().max() < 1e-12
    (a.sin().sum()).backward()
    (b.sin().sum()).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), dense.named_parameters()):
        assert (p.grad - q.grad).abs().max() < 1e-10, name


# --------------------------------------------------------------------------- training options


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_activation_checkpointing_keeps_every_gradient(integration):
    """Decoder integration reads the last layer's source attention as a side
    output: under --checkpoint-activations it must still carry gradients."""
    model, d = build(integration=integration)
    ckpt, _ = build(["--checkpoint-activations"], integration=integration)
    ckpt.load_state_dict(model.state_dict(), strict=True)
    ni = collate(d, corpus(d, [4, 3]), list(range(7)), "online", integration)["net_input"]
    grads = []
    for m in (model, ckpt):
        m.train()
        out, _ = m(**ni)
        out.sin().sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name, g in grads[0].items():
        assert g is not None and grads[1][name] is not None, name
        assert (g - grads[1][name]).abs().max() < 1e-10, name


# --------------------------------------------------------------------------- shared memory


@pytest.mark.parametrize("left_pad_source", [True, False], ids=["left-pad", "right-pad"])
def test_shared_memory_reuses_the_query_encodings(left_pad_source, monkeypatch):
    model, d = build(mode="offline", left_pad_source=left_pad_source)
    data = corpus(d, [5, 1, 4], lengths=[3, 8, 2, 4, 5, 6, 2, 9, 3, 4])
    ni = collate(d, data, [0, 2, 4, 5, 7], "offline", left_pad_source=left_pad_source)[
        "net_input"]
    doc = {k: v for k, v in ni.items() if k not in ("src_tokens", "src_lengths",
                                                     "prev_output_tokens")}
    rows = ni["query_mem_row"]
    assert (rows >= 0).all()  # offline: every query is a memory row too
    encoded = []
    real = TransformerEncoderBase.forward_scriptable

    def spy(self, src_tokens, *args, **kwargs):
        encoded.append(src_tokens.size(0))
        return real(self, src_tokens, *args, **kwargs)

    with torch.no_grad():
        q = model.encoder.forward_scriptable(ni["src_tokens"], ni["src_lengths"])
        q = q["encoder_out"][0]
        monkeypatch.setattr(TransformerEncoderBase, "forward_scriptable", spy)
        shared, tok1 = model.encoder.memory_states(ni["src_tokens"], q, doc)
        # without the collater's index tensors: computed from query_mem_row
        separate, tok2 = model.encoder.memory_states(
            ni["src_tokens"], q, dict(doc, query_mem_row=torch.full_like(rows, -1),
                                      mem_state_index=None, mem_extra_rows=None))
        S = ni["mem_src_tokens"].size(0)
        assert encoded == [S - rows.numel(), S]  # only the memory rows that are not queries
        # the model's forward encodes the batch and those rows in one call, and the
        # batch's encoder output is the one of the batch alone
        encoded.clear()
        out = model.encoder.forward_scriptable(ni["src_tokens"], ni["src_lengths"])
        both, _ = model.encoder._encode_with_memory(ni["src_tokens"], ni["src_lengths"], doc,
                                                    False)
        assert encoded == [rows.numel(), S]
        for k in ("encoder_out", "encoder_padding_mask", "encoder_embedding"):
            assert both[k][0].shape == out[k][0].shape
        assert torch.equal(both["encoder_padding_mask"][0], out["encoder_padding_mask"][0])
        pad = out["encoder_padding_mask"][0].t()
        assert (both["encoder_out"][0] - out["encoder_out"][0])[~pad].abs().max() < 1e-10
    assert torch.equal(tok1, tok2)
    words = tok1.ne(d.pad()).t()  # W x S
    assert shared.shape == separate.shape == (tok1.size(1), S, 32)
    assert (shared - separate)[words].abs().max() < 1e-10
    # and the query rows really are the query encodings
    for b, row in enumerate(rows.tolist()):
        n = int(ni["src_tokens"][b].ne(d.pad()).sum())
        qs = q[-n:, b] if left_pad_source else q[:n, b]
        ms = shared[:, row][words[:, row]]
        assert torch.equal(qs, ms)


# --------------------------------------------------------------------------- two stages


def test_init_from_sentence_checkpoint_and_freeze(toy_bin, sentence_ckpt):
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                           "--init-from-sentence-checkpoint", sentence_ckpt, *SHARED)
    model = task.build_model(cfg.model)
    shared, fresh = loaded_and_fresh(model, theirs)
    assert "encoder.layers.1.fc1.weight" in shared
    assert "decoder.layers.1.encoder_attn.k_proj.weight" in shared
    assert fresh and all(k.startswith("encoder.context_layer.") for k in fresh), fresh
    assert not any(k.startswith("decoder.context_layer.") for k in shared + fresh)
    assert all(p.requires_grad for p in model.parameters())

    task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                           "--target-context-size", "1", "--context-integration", "decoder",
                           "--init-from-sentence-checkpoint", sentence_ckpt,
                           "--freeze-sentence-level")
    model = task.build_model(cfg.model)
    loaded_and_fresh(model, theirs)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("decoder.context_layer.") for n in trainable)
    assert {n for n, _ in model.named_parameters()} - set(trainable) == {
        n for n, _ in model.sentence_level_parameters()}


def test_frozen_memory_needs_the_stage1_checkpoint(toy_bin):
    task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                           "--context-memory", "frozen")
    with pytest.raises(ValueError,
                       match="--context-memory frozen.*--init-from-sentence-checkpoint"):
        task.build_model(cfg.model)


def test_frozen_memory_copies_stay_the_stage1_model(toy_bin, sentence_ckpt, tmp_path):
    """Decoder integration, frozen memory: the copies equal the stage-1
    weights when built, are not trained (2 updates of the rest), are saved,
    and the checkpoint reloads for fairseq-generate."""
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    args = [*_doc_args("online", "decoder"), "--context-integration", "decoder",
            "--context-memory", "frozen"]
    task, cfg = setup_task(toy_bin, *args, "--init-from-sentence-checkpoint", sentence_ckpt)
    model = task.build_model(cfg.model)
    assert model.encoder.memory_encoder is not None and model.decoder.memory_decoder is not None
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".memory_" in n)
    copies = {n: p for n, p in model.state_dict().items() if ".memory_" in n}
    assert "decoder.memory_decoder.layers.1.encoder_attn.k_proj.weight" in copies
    for n, p in copies.items():
        assert torch.equal(p, theirs[n.replace("memory_encoder.", "").replace(
            "memory_decoder.", "")]), n

    save = str(tmp_path / "frozen")
    out = train_and_generate(
        toy_bin, save, ARCH, max_update=2,
        extra=[*args, "--share-all-embeddings", "--init-from-sentence-checkpoint",
               sentence_ckpt],
        gen_extra=_doc_args("online", "decoder", generation=True))
    assert len(hypotheses(out)) == _n_test(toy_bin)
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=True)["model"]
    frozen = {k: v for k, v in state.items() if ".memory_" in k}
    assert set(frozen) == set(copies)
    for k, v in frozen.items():
        assert torch.equal(v, theirs[k.replace("memory_encoder.", "").replace(
            "memory_decoder.", "")]), k
    # ... while the model's own sentence-level layers were trained
    assert not torch.equal(state["encoder.layers.0.fc1.weight"],
                           theirs["encoder.layers.0.fc1.weight"])
    assert not torch.equal(state["decoder.layers.1.fc2.weight"],
                           theirs["decoder.layers.1.fc2.weight"])


@pytest.mark.parametrize("freeze", [False, True], ids=["copies", "freeze-sentence-level"])
def test_frozen_memory_is_computed_without_gradients_in_eval_mode(freeze):
    """The frozen memory runs under no_grad and without dropout (eval mode)
    while the model trains; it comes from the frozen copies (or, with
    --freeze-sentence-level, from the model's own frozen layers)."""
    extra = ["--context-memory", "frozen", "--dropout", "0.3"]
    model, d = build(extra + (["--freeze-sentence-level"] if freeze else []),
                     integration="decoder", double=False)
    assert (model.encoder.memory_encoder is None) == freeze
    mem_enc = model.encoder if freeze else model.encoder.memory_encoder
    mem_dec = model.decoder if freeze else model.decoder.memory_decoder
    data = corpus(d, [4, 3])
    ni = collate(d, data, list(range(7)), "online", "decoder")["net_input"]
    seen = []

    def record(module, args):
        if module.training or torch.is_grad_enabled():
            seen.append((module.training, torch.is_grad_enabled()))

    hooks = [mem_enc.layers[0].register_forward_pre_hook(record),
             mem_dec.layers[-1].register_forward_pre_hook(record)]
    model.train()
    try:
        memories = []
        for _ in range(2):
            enc = model.encoder(**enc_input(ni))
            n = len(seen)
            memories.append(model.decoder.memory_states(enc))
            assert len(seen) == n  # the memory decoding: eval mode, no grad
            assert not any(t.requires_grad for t in memories[-1])
        enc_in_model = enc["mem_encoder_out"][0]
        # only the query encodings (own layers, --freeze-sentence-level) train
        assert seen == ([(True, True)] * 2 if freeze else [])
    finally:
        for h in hooks:
            h.remove()
    assert not enc_in_model.requires_grad
    assert all(torch.equal(x, y) for x, y in zip(*memories))  # no dropout
    out, _ = model(**ni)
    out.sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".memory_" in n)
    assert model.decoder.context_layer.context_attn.k_w_proj.weight.grad.abs().sum() > 0
    assert model.training and mem_dec.training  # modes restored
    if freeze:
        return
    # the frozen copies, not the model's own layers, give the memory
    model.eval()
    with torch.no_grad():
        enc = model.encoder(**enc_input(ni))
        before = model.decoder.memory_states(enc)
        for p in list(model.decoder.layers.parameters()) + list(model.encoder.layers.parameters()):
            p.add_(0.5)
        model.clear_memory_cache()  # recomputed: by the copies
        enc = model.encoder(**enc_input(ni))
        after = model.decoder.memory_states(enc)
    assert all(torch.equal(x, y) for x, y in zip(before, after))


# --------------------------------------------------------------------------- frozen memory cache

FROZEN = ["--context-memory", "frozen"]


def _frozen_calls(model):
    """Count the forward calls of the frozen copies (the cache misses' work)."""
    calls = []
    parts = [model.encoder.memory_encoder, model.decoder.memory_decoder]
    hooks = [p.layers[0].register_forward_pre_hook(lambda m, a: calls.append(m))
             for p in parts if p is not None]
    return calls, hooks


def _forward(model, ni):
    with torch.no_grad():
        return model(**ni)[0]


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_cached_frozen_memory_gives_the_uncached_outputs(mode, integration):
    """Frozen memory read from the cache (full precision, misses in several
    chunks, later batches of the same documents hitting) == computed per
    batch without a cache; gradients too; float16 storage (an option) stays close."""
    model, d = build(FROZEN, integration=integration, mode=mode, cache="full")
    model.encoder.memory_chunk_tokens = model.decoder.memory_chunk_tokens = 20
    data = corpus(d, [6, 1, 5])
    batches = [collate(d, data, rows, mode, integration)["net_input"]
               for rows in ([0, 1, 2, 6], [3, 4, 5, 9, 10], [7, 8, 11], list(range(12)))]
    cached = [_forward(model, ni) for ni in batches]
    cache = model.memory_cache
    assert len(cache) > 0 and cache.hits > 0 and cache.misses == len(cache)
    assert all(t.dtype == torch.float64 for e in cache.store.values() for t in e)
    model.set_memory_cache(None)
    for ni, out in zip(batches, cached):
        ref = _forward(model, ni)
        real = ni["prev_output_tokens"].ne(d.pad())
        assert (out - ref)[real].abs().max() < 1e-10
    # gradients (training mode, dropout 0): the same
    grads = []
    for c in (cache, None):
        model.set_memory_cache(c)
        model.zero_grad()
        model.train()
        model(**batches[1])[0].sin().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    model.eval()
    assert grads[0].keys() == grads[1].keys() and any(".context_layer." in n for n in grads[0])
    for n, g in grads[0].items():
        assert (g - grads[1][n]).abs().max() < 1e-10, n
    # float16 storage (an option): the same up to float16 rounding
    model.set_memory_cache(SentenceStateCache(dtype=torch.float16))
    half = [_forward(model, ni) for ni in batches]
    assert all(t.dtype == torch.float16 and t.device.type == "cpu"
               for e in model.memory_cache.store.values() for t in e)
    err = max((h - c).abs().max().item() for h, c in zip(half, cached))
    assert 0 < err < 1e-2
    # the default storage (the model's precision): exactly the uncached outputs
    model.set_memory_cache(SentenceStateCache())
    assert [_forward(model, ni).tolist() for ni in batches] == [c.tolist() for c in cached]


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_a_second_forward_computes_no_memory(integration, monkeypatch):
    """The same batch twice: the second reads every memory sentence from the
    cache (no frozen forward); a later chunk of a document computes only its
    new memory sentences."""
    model, d = build(FROZEN, integration=integration)
    cache = model.memory_cache
    assert isinstance(cache, SentenceStateCache) and cache.dtype is None  # model's precision
    data = corpus(d, [8, 3])
    first = collate(d, data, [0, 1, 2, 3, 8, 9], "online", integration)["net_input"]
    calls, hooks = _frozen_calls(model)
    try:
        out1 = _forward(model, first)
        n_calls, misses = len(calls), cache.misses
        n_mem = first["mem_src_tokens"].size(0)  # online: positions 0-2 and 8's 0-1 -> 3 + 1
        per_sentence = 2 if integration == "decoder" else 1  # source; (source, target)
        assert n_calls > 0 and misses == len(cache) == n_mem * per_sentence
        out2 = _forward(model, first)
        assert len(calls) == n_calls and cache.misses == misses  # computed nothing
        assert cache.hits == n_mem * per_sentence
        assert torch.equal(out1, out2)
        # the next chunk of document 0: memory 0-6, of which 0-2 are cached
        later = collate(d, data, [4, 5, 6, 7], "online", integration)["net_input"]
        assert later["mem_src_tokens"].size(0) == 7
        _forward(model, later)
        assert cache.misses - misses == 4 * per_sentence
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_identical_sentences_share_one_entry(integration, monkeypatch):
    """Content-addressed: a sentence repeated in other documents (or at
    other positions) is one entry; decoder integration keys the target
    memory on the source and the target."""
    model, d = build(FROZEN, integration=integration, mode="offline", cache="full")
    src, tgt, ids = corpus(d, [3, 3, 3])
    src[3:6] = src[6:9] = src[0:3]  # documents 1 and 2 repeat document 0's sources ...
    tgt[3:6] = tgt[6:9] = tgt[0:3]  # ... and targets, but for sentence 7's target
    tgt[7] = torch.cat([(tgt[1][:1] + 1 - d.nspecial) % (len(d) - d.nspecial) + d.nspecial,
                        tgt[1][1:]])
    seen = []
    real = SelectiveDocEncoder._encode_frozen

    def spy(enc, mem, lengths, lens, left, rows):
        seen.extend(d.string(mem[i][mem[i].ne(d.pad())]) for i in rows)
        return real(enc, mem, lengths, lens, left, rows)

    monkeypatch.setattr(SelectiveDocEncoder, "_encode_frozen", staticmethod(spy))
    ni = collate(d, (src, tgt, ids), list(range(9)), "offline", integration)["net_input"]
    _forward(model, ni)
    assert ni["mem_src_tokens"].size(0) == 9
    assert len(seen) == len(set(seen)) == 3  # 9 memory sources, 3 distinct: each once
    kinds = [k[0] for k in model.memory_cache.store]
    assert kinds.count("src") == 3
    # targets: (0, t0), (1, t1), (2, t2), (1, t1') -> four (source, target) pairs
    assert kinds.count("tgt") == (4 if integration == "decoder" else 0)


def test_loading_weights_empties_the_cache_which_is_not_saved(toy_bin, sentence_ckpt):
    model, d = build(FROZEN, integration="decoder", double=False)
    cache = model.memory_cache
    assert not any("cache" in k for k in model.state_dict())
    assert not any(isinstance(m, SentenceStateCache) for m in model.modules())
    ni = collate(d, corpus(d, [4, 3]), list(range(7)), "online", "decoder")["net_input"]
    _forward(model, ni)
    assert len(cache) > 0
    model.load_state_dict(model.state_dict())
    assert len(cache) == 0
    _forward(model, ni)
    assert len(cache) > 0
    model._make_frozen_copies()  # new frozen copies: emptied
    assert len(cache) == 0
    _forward(model, ni)
    n = len(cache)
    # weights changed in place behind the model's back: the cache notices (the
    # decoder's: its (source, target) entries; the encoder's: every entry)
    n_tgt = sum(k[0] == "tgt" for k in cache.store)
    assert 0 < n_tgt < n
    for part, recomputed in ((model.decoder.memory_decoder, n_tgt),
                             (model.encoder.memory_encoder, n)):
        with torch.no_grad():
            part.layers[0].fc1.weight.add_(0.1)
        misses = cache.misses
        _forward(model, ni)
        assert len(cache) == n and cache.misses == misses + recomputed
    # a checkpoint restored into a model with a warm cache (as fairseq-train --restore-file)
    task, cfg = setup_task(toy_bin, *_doc_args("online", "decoder"), "--context-integration",
                           "decoder", *FROZEN, "--init-from-sentence-checkpoint", sentence_ckpt)
    model = task.build_model(cfg.model)
    assert model.memory_cache is not None and len(model.memory_cache) == 0
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(4)])
    _forward(model, sample["net_input"])
    assert len(model.memory_cache) > 0
    state = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    own = model.state_dict()
    own.update({k: v for k, v in state.items() if k in own})
    model.load_state_dict(own, strict=True, model_cfg=cfg.model)
    assert len(model.memory_cache) == 0


def test_memory_cache_option():
    model, _ = build(FROZEN + ["--memory-cache-sentences", "5"], double=False)
    assert model.memory_cache.max_sentences == 5
    assert model.encoder.memory_cache is model.memory_cache is model.decoder.memory_cache
    model, d = build(FROZEN + ["--memory-cache-sentences", "0"], integration="decoder")
    assert model.memory_cache is None and model.encoder.memory_cache is None
    ni = collate(d, corpus(d, [4, 3]), list(range(7)), "online", "decoder")["net_input"]
    assert torch.isfinite(_forward(model, ni)).all()  # frozen memory without a cache
    model, _ = build(double=False)  # shared memory: no cache
    assert model.memory_cache is None
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["/dev/null", "--arch", ARCH])
    assert args.memory_cache_sentences == 100000


def test_memory_precomputed_needs_a_frozen_memory(toy_bin, sentence_ckpt):
    with pytest.raises(ValueError, match="--memory-precomputed.*needs --context-memory frozen"):
        task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                               "--memory-precomputed", *SHARED)
        task.build_model(cfg.model)
    task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                           "--memory-precomputed", *FROZEN, "--init-from-sentence-checkpoint",
                           sentence_ckpt)
    assert task.build_model(cfg.model).memory_cache is not None


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_cli_frozen_memory_precomputed(toy_bin, sentence_ckpt, tmp_path, integration,
                                       monkeypatch):
    """fairseq-train (stage 2 from the sentence checkpoint) and
    fairseq-generate with the memory read from the cache and batches that
    count only their own sentences."""
    fetched = []
    real = SentenceStateCache.fetch

    def spy(self, keys, *args, **kwargs):
        fetched.append(len(keys))
        return real(self, keys, *args, **kwargs)

    monkeypatch.setattr(SentenceStateCache, "fetch", spy)
    args = [*_doc_args("online", integration), "--memory-precomputed",
            "--context-integration", integration, *FROZEN]
    save = str(tmp_path / integration)
    out = train_and_generate(
        toy_bin, save, ARCH, max_update=2,
        extra=[*args, "--share-all-embeddings", "--init-from-sentence-checkpoint", sentence_ckpt],
        gen_extra=[*_doc_args("online", integration, generation=True), "--memory-precomputed"])
    assert len(hypotheses(out)) == _n_test(toy_bin)
    assert fetched and sum(fetched) > 0
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=True)
    assert any(".memory_encoder." in k for k in state["model"])
    assert not any("cache" in k for k in state["model"])
    assert state["cfg"]["task"]["memory_precomputed"]


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_a_300_sentence_document_in_small_batches(integration, monkeypatch):
    """``--memory-precomputed`` batching (only the batch's own sentences
    count in --max-tokens) cuts a 300-sentence document into many small
    chunks; each memory sentence is computed once, and the last chunk's
    sentence 299 attends to all 299 previous sentences (softmax sentence
    attention: every visible sentence gets weight), as without a cache."""
    model, d = build([*FROZEN, "--sentence-attn", "softmax"], integration=integration,
                     cache="full")
    data = corpus(d, [300, 2], seed=3)
    ds = dataset(d, data, "online", integration, memory_precomputed=True)
    batches = memory_batches(ds, ds.ordered_indices(), max_tokens=40)
    assert len(batches) > 30 and all(ds.memory_cost(b) <= 40 for b in batches)
    part = model.encoder if integration == "encoder" else model.decoder
    calls, hooks = _frozen_calls(model)
    total_memory = 0
    try:
        for b in batches:
            batch = ds.collater([ds[int(i)] for i in b])
            total_memory += batch["net_input"]["mem_src_tokens"].size(0)
            last = 299 in batch["id"].tolist()
            part.record_stats = last
            out = _forward(model, batch["net_input"])
            if last:
                ni, r = batch["net_input"], batch["id"].tolist().index(299)
                info, out_last = part.last_info, out
        part.record_stats = False
    finally:
        for h in hooks:
            h.remove()
    cache = model.memory_cache
    # every distinct memory sentence computed once (299 of the long document, 1 of the
    # short one; short random sentences repeat)
    src, tgt, _ = data
    mem = list(range(299)) + [300]
    distinct = len({tuple(src[i].tolist()) for i in mem})
    if integration == "decoder":
        distinct += len({(tuple(src[i].tolist()), tuple(tgt[i].tolist())) for i in mem})
    assert cache.misses == len(cache) == distinct
    # online, a chunk's memory holds its own sentences but its last: each batch encodes
    # those (new) ones, in one frozen forward per part
    assert len(calls) <= len(batches) * (2 if integration == "decoder" else 1)
    assert total_memory > 10 * 300  # what a per-batch memory would have computed
    k = int(ni["query_doc"][r])
    assert int((ni["mem_doc"] == k).sum()) == 299
    rows = info["sent_index"][r]
    weights = info["sent_weights"][r]  # H x T x S_max
    valid = rows >= 0
    assert sorted(ni["mem_pos"][rows[valid]].tolist()) == list(range(299))
    real_t = (ni["src_tokens"][r].ne(d.pad()) if integration == "encoder"
              else ni["prev_output_tokens"][r].ne(d.pad()))
    assert (weights[:, real_t][..., valid] > 0).all()  # sees all 299
    model.set_memory_cache(None)
    ref = _forward(model, ni)
    real = ni["prev_output_tokens"].ne(d.pad())
    assert (out_last - ref)[real].abs().max() < 1e-10


# --------------------------------------------------------------------------- errors


def test_clear_errors(toy_bin):
    with pytest.raises(ValueError, match="--document-context online\\|offline --document-memory"):
        task, cfg = setup_task(toy_bin, "--document-context", "online")
        task.build_model(cfg.model)
    with pytest.raises(ValueError, match="--document-memory"):
        args = options.parse_args_and_arch(
            options.get_training_parser(),
            [toy_bin, "--task", "translation", "--arch", ARCH, *TINY_MODEL_ARGS,
             "--source-lang", "src", "--target-lang", "tgt"])
        cfg = convert_namespace_to_omegaconf(args)
        tasks.setup_task(cfg.task).build_model(cfg.model)
    with pytest.raises(ValueError, match="--context-integration decoder.*--target-context-size 1"):
        task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                               "--context-integration", "decoder")
        task.build_model(cfg.model)
    for opts, msg in ((["--decoder-layerdrop", "0.2"], "--decoder-layerdrop 0"),
                      (["--decoder-output-dim", "16"], "--decoder-output-dim equal")):
        with pytest.raises(ValueError, match=msg):
            build(opts, integration="decoder")
        build(opts)  # encoder integration does not read the decoder
    # batches without the memory
    model, d = build(double=False)
    src = torch.tensor([[5, 6, d.eos()]])
    with pytest.raises(ValueError, match="needs the document memory in each batch"):
        model.encoder(src, torch.tensor([3]))
    model, d = build(integration="decoder", double=False)
    ni = collate(d, corpus(d, [3]), [0, 1, 2], "online", "encoder")["net_input"]
    with pytest.raises(ValueError, match="target side of the document memory"):
        model(**ni)


# --------------------------------------------------------------------------- interactive


@pytest.mark.parametrize("batch_size", [1, 3])
def test_interactive_with_encoder_integration(cli_run, toy_bin, toy_corpus, tmp_path,
                                              monkeypatch, batch_size):
    """fairseq-interactive reads documents line by line; the task restores the
    memory inputs: each sentence sees the previous ones of its document."""
    ckpt, _ = cli_run("enc-online-sparse-soft")
    inp = tmp_path / "input.txt"
    doc1, doc2 = write_two_documents(toy_corpus, inp)
    d = Dictionary.load(os.path.join(toy_bin, "dict.src.txt"))
    seen = {}
    real = SelectiveDocEncoder.forward

    def spy(self, src_tokens, src_lengths=None, *args, **kw):
        mem = kw["mem_src_tokens"]
        for b, row in enumerate(src_tokens):
            visible = [d.string(m[m.ne(d.pad())]) for m, md, mp in
                       zip(mem, kw["mem_doc"], kw["mem_pos"])
                       if md == kw["query_doc"][b] and mp < kw["query_pos"][b]]
            seen[d.string(row[row.ne(d.pad())])] = visible
        return real(self, src_tokens, src_lengths, *args, **kw)

    monkeypatch.setattr(SelectiveDocEncoder, "forward", spy)
    out = interactive([toy_bin, "--path", ckpt, *_doc_args("online", "encoder"),
                       "--source-lang", "src", "--target-lang", "tgt", "--beam", "2",
                       "--max-len-b", "6", "--input", str(inp), "--buffer-size", "3",
                       "--batch-size", str(batch_size)])
    assert seen == {doc1[0]: [], doc1[1]: doc1[:1], doc1[2]: doc1[:2],
                    doc2[0]: [], doc2[1]: doc2[:1]}
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert {int(h.split("\t")[0][2:]) for h in hyps} == {0, 1, 2, 4, 5}


# --------------------------------------------------------------------------- hooks


def test_presets_and_demo_hooks():
    from ctx_fairseq.cli.arch_hooks import demo_hooks

    for arch, integration in ((ARCH, "encoder"), ("transformer_selective_doc_dec", "decoder")):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/dev/null", "--arch", arch])
        assert args.context_integration == integration
        assert (args.doc_attention, args.sentence_attn, args.word_attn) == (
            "hierarchical", "sparsemax", "softmax")
        # the paper's model by default (Sec. 3.3): the stage-1 model's states, no distance bias
        assert args.context_memory == "frozen" and args.doc_sentence_distance == 0
        train_args = demo_hooks(arch).train_args_for(arch)
        assert "--document-memory" in train_args
        assert ("--target-context-size" in train_args) == (integration == "decoder")
    model, _ = build(double=False)
    assert not model.uses_target_context
    model, _ = build(integration="decoder", double=False)
    assert model.uses_target_context
    from ctx_fairseq.cli.arch_hooks import default_demo_archs

    assert demo_hooks(ARCH).archs == [ARCH, "transformer_selective_doc_dec"]
    assert {ARCH, "transformer_selective_doc_dec"} <= set(default_demo_archs())


def test_frozen_memory_without_its_frozen_copy_is_an_error():
    """Never read a 'frozen' memory from the trainable weights."""
    import argparse

    from ctx_fairseq.models.transformer_selective_doc.common import frozen_source

    class _M:
        memory_encoder = None
        args = argparse.Namespace(freeze_sentence_level=False)

    with pytest.raises(RuntimeError, match="frozen copy of the sentence-level model is missing"):
        frozen_source(_M(), "memory_encoder")
    _M.args.freeze_sentence_level = True
    m = _M()
    assert frozen_source(m, "memory_encoder") is m


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


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("name", list(HOST_READ_CONFIGS))
def test_training_step_host_reads_are_the_transformers(name, mode):
    """One training forward + backward (the second: a frozen memory's cache is
    warm) reads back no more than fairseq's transformer of the same shape on
    the same batch, plus what HOST_READ_CONFIGS allows per batch: the context
    layer itself reads nothing (static shapes, the collater's index tensors)."""
    from fairseq_cli_utils import accelerator_path, build_tiny_model

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

    accelerator_path(model)
    step(model, ni)  # warm: a frozen memory's cache misses
    got = _reads(lambda: step(model, ni))
    ref = _reads(lambda: step(plain, plain_in))
    assert sum(got.values()) <= sum(ref.values()) + allowed, (got, ref)
    assert not {"nonzero", "unique", "bool_index", "masked_select", "bincount"} & set(got), got


@pytest.mark.parametrize("extra", [[], ["--word-attn", "sparsemax"],
                                   ["--doc-attention", "flat-word"],
                                   ["--context-memory", "frozen"]],
                         ids=lambda e: "-".join(e) or "default")
def test_incremental_step_host_reads_are_the_transformers(extra):
    """Decoder integration, incremental decoding: after the first step (which
    computes the memory), a step reads back exactly what the transformer's
    step reads; a beam reorder adds nothing."""
    from fairseq_cli_utils import accelerator_path, build_tiny_model

    model, d = build(extra, integration="decoder", mode="online", double=False)
    accelerator_path(model)
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
