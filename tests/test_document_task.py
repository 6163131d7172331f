"""document_translation task and DocumentContextDataset: document ids checks,
context windows (property test over random layouts), ablations, collation,
document batching, sharding by documents, target context sources."""

import os
import random
import shutil

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the task)
from fairseq import options, tasks
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_cli_utils import document_dataset

from ctx_fairseq.data.document_dataset import DocumentContextDataset
from ctx_fairseq.data.docids import DocumentIdError
from ctx_fairseq.data.batching import assign_shards, document_batches


# --------------------------------------------------------------------------- helpers


def setup_task(data, *extra):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data, "--task", "document_translation", "--arch", "transformer", *extra])
    return tasks.setup_task(convert_namespace_to_omegaconf(args).task)


def copy_bin(toy_bin, tmp_path):
    dest = str(tmp_path / "bin")
    shutil.copytree(toy_bin, dest)
    return dest


def make_dict(n=40):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


def synthetic(doc_sizes, data_seed=0, d=None, **kw):
    """A dataset whose sentence j has random length 1-5 and random words;
    doc ids from ``doc_sizes``."""
    d = d or make_dict()
    rng = random.Random(data_seed)
    src, tgt, ids = [], [], []
    for doc, n in enumerate(doc_sizes):
        for _ in range(n):
            length = rng.randint(1, 5)
            s = torch.tensor([rng.randrange(d.nspecial, len(d)) for _ in range(length)] + [d.eos()])
            t = torch.tensor([rng.randrange(d.nspecial, len(d)) for _ in range(length + 1)] + [d.eos()])
            src.append(s)
            tgt.append(t)
            ids.append(f"doc{doc}")
    base = LanguagePairDataset(src, np.array([len(s) for s in src]), d, tgt,
                               np.array([len(t) for t in tgt]), d, shuffle=True)
    return document_dataset(base, ids, **kw), src, tgt


def strip_eos(t, eos):
    return t[:-1] if len(t) and int(t[-1]) == eos else t


# --------------------------------------------------------------------------- document ids


def test_docids_count_mismatch_is_a_clear_error(toy_bin, tmp_path):
    data = copy_bin(toy_bin, tmp_path)
    path = os.path.join(data, "test.docids")
    lines = open(path).read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[:-3]) + "\n")
    task = setup_task(data)
    with pytest.raises(DocumentIdError) as err:
        task.load_dataset("test")
    msg = str(err.value)
    assert path in msg and f"{len(lines) - 3} document ids for {len(lines)} sentences" in msg


def test_docids_non_contiguous_document_is_a_clear_error(toy_bin, tmp_path):
    data = copy_bin(toy_bin, tmp_path)
    path = os.path.join(data, "test.docids")
    lines = open(path).read().splitlines()
    first = lines[0]
    bad = next(i for i, x in enumerate(lines) if x != first) + 2  # inside the 2nd document
    lines[bad] = first
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(DocumentIdError) as err:
        setup_task(data).load_dataset("test")
    msg = str(err.value)
    assert f"{path}:{bad + 1}" in msg and f"document {first} reappears" in msg and "contiguous" in msg


def test_docids_missing_or_empty_line(toy_bin, tmp_path):
    data = copy_bin(toy_bin, tmp_path)
    path = os.path.join(data, "valid.docids")
    lines = open(path).read().splitlines()
    lines[4] = ""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(DocumentIdError, match=rf"{path}:5: empty document id"):
        setup_task(data).load_dataset("valid")
    os.remove(os.path.join(data, "test.docids"))
    with pytest.raises(DocumentIdError, match="test.docids: document ids not found"):
        setup_task(data).load_dataset("test")


# --------------------------------------------------------------------------- context windows


def random_layout(rng, docs: int, sentences: int, size: int):
    """A random document layout and context setting: ``(document sizes,
    context size, direction, whole-document context)``, drawn from ``rng``
    in that order (up to ``docs`` documents of up to ``sentences``
    sentences, a context size up to ``size``)."""
    sizes = [rng.randint(1, sentences) for _ in range(rng.randint(1, docs))]
    k = rng.randint(1, size)
    direction = rng.choice(["prev", "next", "both"])
    return sizes, k, direction, rng.choice(["none", "none", "online", "offline"])


def test_context_never_crosses_documents_property():
    """Random layouts (seeded): context stays inside the document, prev/online
    context never sees the current or a later sentence, sizes are respected,
    and the context tokens are the context sentences in order."""
    for seed in range(25):
        rng = random.Random(seed)
        sizes, k, direction, doc_ctx = random_layout(rng, 8, 7, 4)
        ds, src, _ = synthetic(sizes, seed, src_context_size=k, direction=direction,
                               document_context=doc_ctx)
        doc_of = np.repeat(np.arange(len(sizes)), sizes)
        starts = np.cumsum([0] + sizes[:-1])
        eos = ds.eos
        for i in range(len(ds)):
            ctx = ds.context_indices(i)
            assert all(doc_of[j] == doc_of[i] for j in ctx), (seed, i, ctx)
            assert i not in ctx
            assert ds.doc_index[i] == doc_of[i] and ds.sent_pos[i] == i - starts[doc_of[i]]
            doc = list(range(starts[doc_of[i]], starts[doc_of[i]] + sizes[doc_of[i]]))
            if doc_ctx == "online":
                assert ctx == [j for j in doc if j < i]
            elif doc_ctx == "offline":
                assert ctx == [j for j in doc if j != i]
            else:
                want = []
                if direction in ("prev", "both"):
                    want += [j for j in doc if i - k <= j < i]
                if direction in ("next", "both"):
                    want += [j for j in doc if i < j <= i + k]
                assert ctx == want
            if doc_ctx == "online" or (doc_ctx == "none" and direction == "prev"):
                assert all(j < i for j in ctx)
            toks = ds.context_tokens(i)
            expect = torch.cat([torch.cat([strip_eos(src[j], eos), torch.tensor([eos])])
                                for j in ctx]) if ctx else torch.empty(0, dtype=torch.long)
            assert torch.equal(toks, expect), (seed, i)
            if sizes[doc_of[i]] == 1 or (i == starts[doc_of[i]] and direction == "prev"
                                          and doc_ctx != "offline"):
                assert toks.numel() == 0


def test_set_target_context_equals_a_full_refresh():
    """Changing target sentences one at a time (the model's own translations)
    updates windows, cuts, lengths, the longest context sentence and the
    truncation counts exactly as recomputing everything does; random layouts,
    directions, whole-document context and length limits (one, per sentence)."""
    for seed in range(12):
        rng = random.Random(seed)
        sizes, k, direction, doc_ctx = random_layout(rng, 6, 9, 3)
        n = sum(sizes)
        limit = rng.choice([None, rng.randint(1, 9), np.array([rng.randint(0, 9)
                                                                 for _ in range(n)])])
        kw = dict(src_context_size=rng.randint(0, 2), tgt_context_size=k, direction=direction,
                  document_context=doc_ctx, max_tgt_context_tokens=limit,
                  context_layout={"tgt": "sentences"} if doc_ctx == "none" else None)
        d = make_dict()
        ds, _, tgt = synthetic(sizes, seed, d=d, tgt_context=None, **kw)
        ds, _, tgt = synthetic(sizes, seed, d=d, tgt_context=list(tgt), **kw)
        for step in range(2 * n):
            i = rng.randrange(n)
            length = rng.randint(0, 8)
            t = torch.tensor([rng.randrange(d.nspecial, len(d)) for _ in range(length)]
                             + ([d.eos()] if rng.random() < 0.8 else []), dtype=torch.long)
            before = [ds[j].get("tgt_ctx") for j in range(n)]
            changed = set(ds.set_target_context(i, t).tolist())
            ref = document_dataset(ds.base, [f"doc{x}" for x in ds.doc_index],
                                         tgt_context=list(ds.tgt_context), **kw)
            for name in ("partial", "context_length", "longest"):
                got, want = getattr(ds, name)["tgt"], getattr(ref, name)["tgt"]
                assert (got is None and want is None) or np.array_equal(got, want), (seed, name)
            for got, want in zip(ds.windows["tgt"], ref.windows["tgt"]):
                assert np.array_equal(got, want), seed
            assert ds.truncation == ref.truncation, seed
            order = np.arange(n)
            assert np.array_equal(ds._part_lengths(order), ref._part_lengths(order))
            for j in range(n):
                assert torch.equal(ds[j]["tgt_ctx"], ref[j]["tgt_ctx"]), (seed, j)
                if not torch.equal(ds[j]["tgt_ctx"], before[j]):
                    assert j in changed, (seed, step, i, j)


def test_first_sentence_of_each_document_has_empty_context(toy_bin):
    task = setup_task(toy_bin, "--source-context-size", "2")
    task.load_dataset("test")
    ds = task.datasets["test"]
    firsts = ds.doc_start.tolist()
    batch = ds.collater([ds[i] for i in range(len(ds))])
    ni = batch["net_input"]
    pad = task.src_dict.pad()
    for row, i in enumerate(batch["id"].tolist()):
        n_ctx = int(ni["src_ctx_lengths"][row])
        assert (n_ctx == 0) == (i in firsts)
        assert int(ni["src_ctx_tokens"][row].ne(pad).sum()) == n_ctx
    # left padding like the source: real tokens at the right end
    assert task.cfg.left_pad_source
    full = ni["src_ctx_tokens"][ni["src_ctx_lengths"] == ni["src_ctx_tokens"].size(1)]
    assert full.numel() and (full[:, -1] == task.src_dict.eos()).all()
    assert set(batch["doc_index"].tolist()) == set(range(len(firsts)))


def test_collate_matches_items_and_batch_order():
    ds, _, _ = synthetic([3, 4, 2], 1, src_context_size=2, tgt_context_size=1)
    idx = [5, 0, 8, 3, 1]
    batch = ds.collater([ds[i] for i in idx])
    ni = batch["net_input"]
    pad = ds.src_dict.pad()
    for row, i in enumerate(batch["id"].tolist()):
        want = ds.context_tokens(i, "src")
        got = ni["src_ctx_tokens"][row]
        got = got[got.ne(pad)]
        assert torch.equal(got, want)
        assert int(ni["src_ctx_lengths"][row]) == want.numel()
        tw = ds.context_tokens(i, "tgt")
        tg = ni["tgt_ctx_tokens"][row]
        assert torch.equal(tg[:tw.numel()], tw)  # target side: right padding
    assert ni["src_ctx_tokens"].size(1) >= 1


def test_separator_symbol(toy_bin):
    ds, src, _ = synthetic([3], 2, src_context_size=2, separator=7)
    toks = ds.context_tokens(2)
    parts = [strip_eos(src[0], ds.eos), torch.tensor([7]), strip_eos(src[1], ds.eos),
             torch.tensor([ds.eos])]
    assert torch.equal(toks, torch.cat(parts))
    with pytest.raises(ValueError, match="--context-separator '<nope>' is not in the source"):
        task = setup_task(toy_bin, "--context-separator", "<nope>")
        task.load_dataset("test")


# --------------------------------------------------------------------------- ablations


def test_shuffled_context_comes_from_other_documents_deterministically():
    sizes = [4, 5, 3, 6]
    ds, src, _ = synthetic(sizes, 3, src_context_size=1, ablation="shuffled", seed=5)
    real, _, _ = synthetic(sizes, 3, src_context_size=1)
    again, _, _ = synthetic(sizes, 3, src_context_size=1, ablation="shuffled", seed=5)
    other, _, _ = synthetic(sizes, 3, src_context_size=1, ablation="shuffled", seed=6)
    doc_of = np.repeat(np.arange(len(sizes)), sizes)
    changed = 0
    for i in range(len(ds)):
        if not real.context_indices(i):
            assert ds.context_indices(i) == []
            continue
        ctx = ds.context_indices(i)
        assert len(ctx) == 1 and doc_of[ctx[0]] != doc_of[i]
        assert ctx == again.context_indices(i)
        changed += ctx != other.context_indices(i)
        assert torch.equal(ds.context_tokens(i), torch.cat([strip_eos(src[ctx[0]], ds.eos),
                                                             torch.tensor([ds.eos])]))
    assert changed > 0


def test_random_context_keeps_layout_and_is_deterministic():
    sizes = [5, 5]
    real, _, _ = synthetic(sizes, 4, src_context_size=2)
    ds, _, _ = synthetic(sizes, 4, src_context_size=2, ablation="random", seed=3)
    again, _, _ = synthetic(sizes, 4, src_context_size=2, ablation="random", seed=3)
    differs = 0
    for i in range(len(ds)):
        a, b = real.context_tokens(i), ds.context_tokens(i)
        assert a.shape == b.shape
        sep = a.eq(ds.eos)
        assert torch.equal(b[sep], a[sep]) and (b[~sep] >= ds.src_dict.nspecial).all()
        assert torch.equal(b, again.context_tokens(i))
        differs += not torch.equal(a, b)
    assert differs > 0


# --------------------------------------------------------------------------- batching / sharding


def test_document_batches_whole_documents_within_max_tokens():
    rng = np.random.RandomState(0)
    sizes = rng.randint(1, 9, size=40)
    doc_index = np.repeat(np.arange(len(sizes)), sizes)
    ntok = rng.randint(2, 12, size=len(doc_index))
    order = np.concatenate([np.flatnonzero(doc_index == d) for d in rng.permutation(len(sizes))])
    max_tokens = 60
    batches = document_batches(order, doc_index, ntok[order], max_tokens=max_tokens)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(doc_index)))
    for b in batches:
        assert len(b) * ntok[b].max() <= max_tokens or len(b) == 1
    # a document is split only when it cannot fit into one batch by itself
    where = {}
    for k, b in enumerate(batches):
        for dd in set(doc_index[b].tolist()):
            where.setdefault(dd, []).append(k)
    for dd, ks in where.items():
        if len(ks) > 1:
            members = np.flatnonzero(doc_index == dd)
            assert len(members) * ntok[members].max() > max_tokens
            assert ks == list(range(ks[0], ks[0] + len(ks)))  # consecutive chunks


def test_two_shards_partition_sentences(toy_bin):
    """fairseq's round-robin shards of document batches: each sentence on one
    shard, both shards as long (documents whole per shard only for
    --own-target-context generation: tests/test_data_parallel.py)."""
    task = setup_task(toy_bin, "--document-batching", "--source-context-size", "1")
    task.load_dataset("train")
    ds = task.datasets["train"]
    seen = {}
    lengths = []
    for shard in range(2):
        itr = task.get_batch_iterator(ds, max_tokens=120, seed=1, num_shards=2, shard_id=shard,
                                      epoch=1, disable_iterator_cache=True)
        lengths.append(len(itr))
        n_batches = 0
        for batch in itr.next_epoch_itr(shuffle=True):
            n_batches += 1
            if not batch:
                continue
            for i in batch["id"].tolist():
                assert i not in seen
                seen[i] = shard
        assert n_batches == len(itr)
    assert lengths[0] == lengths[1]
    assert sorted(seen) == list(range(len(ds)))
    assert set(seen.values()) == {0, 1}


def test_assign_shards_keeps_chunked_documents_together():
    doc_index = np.array([0] * 6 + [1] * 2 + [2] * 2 + [3] * 7)
    batches = [np.arange(0, 3), np.arange(3, 6), np.arange(6, 10), np.arange(10, 14),
               np.arange(14, 17)]
    shards = assign_shards(batches, doc_index, 2)
    assert sorted(shards[0] + shards[1]) == list(range(5))
    for s in shards:
        docs = set(np.concatenate([doc_index[batches[b]] for b in s]).tolist())
        for other in shards:
            if other is not s:
                assert not docs & set(np.concatenate([doc_index[batches[b]] for b in other]).tolist())


def test_generation_batches_in_document_order(toy_bin):
    task = setup_task(toy_bin, "--document-context", "online")
    task.load_dataset("test")
    ds = task.datasets["test"]
    itr = task.get_batch_iterator(ds, max_tokens=100, seed=1, disable_iterator_cache=True)
    ids = []
    for batch in itr.next_epoch_itr(shuffle=False):
        assert "src_ctx_sent_offsets" in batch["net_input"]
        offs = batch["net_input"]["src_ctx_sent_offsets"]
        assert (offs <= 0).all()  # online: previous sentences only
        ids.extend(sorted(batch["id"].tolist()))
    assert ids == list(range(len(ds)))


# --------------------------------------------------------------------------- target context


def test_target_context_file_and_generation_requirement(toy_bin, tmp_path):
    task = setup_task(toy_bin, "--target-context-size", "1")
    task.load_dataset("test")
    with pytest.raises(ValueError, match="--gold-target-context"):
        task.build_generator([], options.parse_args_and_arch(
            options.get_generation_parser(), [toy_bin]))
    n = len(task.datasets["test"])
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("".join(f"hyp{i} ist\n" for i in range(n - 1)))
    with pytest.raises(ValueError, match=rf"hyp.txt: {n - 1} lines for {n} sentences"):
        setup_task(toy_bin, "--target-context-size", "1", "--target-context-file",
                   str(hyp)).load_dataset("test")
    hyp.write_text("".join(f"ist hier {i}\n" for i in range(n)))
    t2 = setup_task(toy_bin, "--target-context-size", "1", "--target-context-file", str(hyp))
    t2.load_dataset("test")
    ds = t2.datasets["test"]
    i = int(ds.doc_start[0]) + 2
    got = t2.tgt_dict.string(ds[i]["tgt_ctx"])
    assert got.split()[:2] == ["ist", "hier"] and len(got.split()) == 3  # "<unk>" for the number
    gold = task.datasets["test"]
    assert t2.tgt_dict.string(gold[i]["tgt_ctx"]) == task.tgt_dict.string(gold.base.tgt[i - 1])


def test_inference_dataset_treats_input_lines_as_one_document(toy_bin):
    task = setup_task(toy_bin, "--source-context-size", "1")
    d = task.src_dict
    lines = ["it sleeps now .", "we walk again .", "the bank is big ."]
    toks = [d.encode_line(x, add_if_not_exist=False).long() for x in lines]
    ds = task.build_dataset_for_inference(toks, [t.numel() for t in toks])
    assert ds[0]["src_ctx"].numel() == 0
    assert d.string(ds[2]["src_ctx"]) == lines[1]
    batch = ds.collater([ds[i] for i in range(3)])
    assert batch["net_input"]["src_ctx_tokens"].size(0) == 3


def test_sentence_level_model_with_context_is_a_clear_error(toy_bin):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--task", "document_translation", "--arch", "transformer",
         "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
         "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
         "--decoder-ffn-embed-dim", "16"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    with pytest.raises(ValueError, match="--arch transformer does not take document context"):
        task.build_model(cfg.model)
    cfg.task.source_context_size = 0
    task = tasks.setup_task(cfg.task)
    assert task.build_model(cfg.model) is not None


# --------------------------------------------------------------------------- --max-tokens, per model


def _document_archs():
    """``(arch, task options)`` of every architecture of the plugin that reads
    the document task's context: those ctx-demo trains with ``--task
    document_translation`` (``DemoHooks.train_args``), and those whose context
    contract declares a context input (which must then have the hook)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from ctx_fairseq.cli.arch_hooks import demo_hooks
    from ctx_fairseq.data.contract import contract_of

    out = []
    for arch, cls in sorted(ARCH_MODEL_REGISTRY.items()):
        if not cls.__module__.startswith("ctx_fairseq."):
            continue
        argv = demo_hooks(arch).train_args_for(arch)
        reads = contract_of(cls).inputs
        if "document_translation" in argv:
            out.append((arch, argv))
        else:
            assert not reads, (f"{arch} reads {sorted(reads)} but has no ctx-demo train_args with "
                               "--task document_translation: give it one (ctx-demo and this "
                               "test need its task options)")
    return out


@pytest.mark.parametrize("arch,argv", _document_archs(), ids=lambda x: x if isinstance(x, str)
                         else None)
def test_max_tokens_bounds_the_tokens_every_context_model_embeds(arch, argv):
    """For every architecture that reads the task's context (found in the
    registry, so a new model is checked without being listed here): the
    tokens its forward embeds per side (encoder and decoder embeddings, every
    call: the sentence, its context sentences however the model lays them
    out, a document memory) stay within the --max-tokens of the batches the
    task makes for it. A model that lays its context out other than the task
    counts it (e.g. one row per context sentence) fails here until it declares
    ``context_layout`` (its contract: ctx_fairseq.data.contract.model_contract)."""
    from fairseq_cli_utils import TINY_MODEL_ARGS

    from ctx_fairseq.data.contract import contract_of
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    M = 300
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", arch, *argv, *TINY_MODEL_ARGS, "--dropout", "0"])
    cfg = convert_namespace_to_omegaconf(args)
    d = make_dict(40)
    task = DocumentTranslationTask(cfg.task, d, d)
    torch.manual_seed(0)
    model = task.build_model(cfg.model, from_checkpoint=True).eval()
    # documents mixing long and short sentences (k x the longest context sentence
    # is then far above the concatenated context)
    src_len, tgt_len = [24, 2, 3, 2, 19, 2], [3, 21, 2, 2, 3, 17]
    g = torch.Generator().manual_seed(1)

    def sentence(n):
        s = torch.randint(d.nspecial, len(d), (n,), generator=g)
        s[-1] = d.eos()
        return s

    n = 8 * len(src_len)
    src = [sentence(src_len[i % 6]) for i in range(n)]
    tgt = [sentence(tgt_len[i % 6]) for i in range(n)]
    base = LanguagePairDataset(src, [len(x) for x in src], d, tgt, [len(x) for x in tgt], d,
                               shuffle=False)
    ds = task.wrap(base, [f"doc{i // 6}" for i in range(n)], "<synthetic>")
    counts = {}

    def counter(side):
        def hook(module, inputs, output):
            counts[side] += inputs[0].numel()
        return hook

    assert model.encoder.embed_tokens is not model.decoder.embed_tokens
    # every token embedding counts: the model's own and those of any copy it encodes a
    # memory with (transformer_selective_doc's frozen memory: encoder.memory_encoder,
    # decoder.memory_decoder), on the side of the part that holds it
    embeddings = [(name.split(".")[0], m) for name, m in model.named_modules()
                  if name.endswith("embed_tokens")]
    assert {side for side, _ in embeddings} == {"encoder", "decoder"}
    handles = [m.register_forward_hook(counter(side)) for side, m in embeddings]
    itr = task.get_batch_iterator(ds, max_tokens=M, seed=1, disable_iterator_cache=True)
    most = {"encoder": 0, "decoder": 0}
    seen = 0
    try:
        for sample in itr.next_epoch_itr(shuffle=False):
            counts.update(encoder=0, decoder=0)
            # the model's contract declares every context input the task's batches carry
            sent = set(sample["net_input"]) - {"src_tokens", "src_lengths", "prev_output_tokens"}
            assert sent <= set(contract_of(model).inputs), (arch, sorted(sent))
            with torch.no_grad():
                model(**sample["net_input"])
            seen += len(sample["id"])
            assert counts["encoder"] <= M and counts["decoder"] <= M, (arch, counts)
            most = {k: max(v, counts[k]) for k, v in most.items()}
    finally:
        for h in handles:
            h.remove()
    assert seen == n
    assert max(most.values()) > M // 2  # full batches, not a vacuous bound
