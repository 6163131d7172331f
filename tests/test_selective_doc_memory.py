"""transformer_selective_doc's memory: two-stage training with a frozen
memory, and the frozen memory's cache (same outputs, computed once, shared,
emptied on loading, ``--memory-precomputed``, a 300-sentence document in
small batches)."""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)
from fairseq import checkpoint_utils, options

from ctx_fairseq.data.batching import memory_batches
from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder
from ctx_fairseq.modules.sentence_cache import SentenceStateCache
from fairseq_cli_utils import (
    hypotheses,
    loaded_and_fresh,
    train_and_generate,
)

VOCAB = 40
from selective_doc_utils import (
    ARCH,
    build,
    corpus,
    dataset,
    collate,
    enc_input,
    setup_task,
    SHARED,
    _doc_args,
    _n_test,
)


pytestmark = pytest.mark.usefixtures("one_thread")


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
