"""transformer_selective_doc (Maruf et al. 2019, selective attention over the
whole document): the fairseq CLIs for every attention variant and both
integrations, incremental decoding with beam reorder (memory computed once),
padding invariance, visibility through the model, the no-context bypass,
dense == selective, query-encoding reuse, empty memories, clear errors and
fairseq-interactive. The frozen memory: tests/test_selective_doc_memory.py;
host reads and half precision: tests/test_selective_doc_device.py."""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)
from fairseq import options, tasks
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerEncoderBase

from ctx_fairseq.models.transformer_selective_doc.decoder import SelectiveDocDecoder
from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    decode_with_reorder,
    hypotheses,
    interactive,
    train_and_generate,
    write_two_documents,
)

VOCAB = 40
from selective_doc_utils import (
    ARCH,
    beam_case,
    build,
    corpus,
    collate,
    enc_input,
    sentence_level_copy,
    setup_task,
    count_calls,
    SHARED,
    _doc_args,
    _n_test,
)


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- fairseq CLIs

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
    split = 3
    enc_calls = count_calls(monkeypatch, SelectiveDocEncoder)
    dec_calls = count_calls(monkeypatch, SelectiveDocDecoder)
    # beam search reorders within each sentence's beam (and duplicates hypotheses)
    enc, prev, order = beam_case(model, d, mode, [4, 3], [1, 2, 3, 5, 6])
    with torch.no_grad():
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
