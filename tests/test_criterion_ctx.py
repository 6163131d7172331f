"""label_smoothed_cross_entropy_ctx: fairseq's label-smoothed cross-entropy
plus the context models' statistics (docs/criterion.md). fairseq-train logs
the statistics (train_inner / train / valid, JSON) for each context
architecture; the logged means pool batches exactly (sum / count); loss,
gradients and logging output are those of label_smoothed_cross_entropy; the
statistics are the ones computed independently from the recorded tensors."""

import json
import logging
import math
import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq import options, tasks
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.logging import metrics

from ctx_fairseq.criterions.label_smoothed_cross_entropy_ctx import (
    LabelSmoothedCrossEntropyCtxCriterion,
)
from fairseq_cli_utils import TINY_MODEL_ARGS, USER_DIR, train

CTX_ARGS = ["--task", "document_translation", "--source-context-size", "1"]
#: the statistics do not depend on where the memory comes from: a memory with gradients
#: (``shared``; the architecture's default, ``frozen``, needs a stage-1 checkpoint)
SEL_ARGS = ["--task", "document_translation", "--document-context", "online",
            "--document-memory", "--context-memory", "shared"]
SEL_DEC_ARGS = SEL_ARGS + ["--target-context-size", "1"]

#: architecture name -> (fairseq-train options, statistics it must log)
CONFIGS = {
    "hybrid": (["--arch", "transformer_hybrid", "--hybrid-decoder-layers", "1",
                "--hybrid-gate-per-head"],
               ["gate_enc1", "gate_enc2", "gate_dec1"]),
    "context_aware": (["--arch", "transformer_context_aware", *CTX_ARGS],
                      ["gate", "ctx_mass", "ctx_frac"]),
    "selective_enc": (["--arch", "transformer_selective_doc", *SEL_ARGS],
                      ["gate", "ctx_mass", "ctx_frac", "sent_support", "sent_visible",
                       "word_support", "word_overflow"]),
    "selective_dec_sparse": (["--arch", "transformer_selective_doc_dec", *SEL_DEC_ARGS,
                              "--word-attn", "sparsemax"],
                             ["gate", "ctx_mass", "ctx_frac", "sent_support", "sent_visible",
                              "word_support", "word_overflow"]),
    "selective_flat_sentence": (["--arch", "transformer_selective_doc", *SEL_ARGS,
                                 "--doc-attention", "flat-sentence"],  # no word level
                                ["gate", "ctx_mass", "ctx_frac", "sent_support",
                                 "sent_visible"]),
    "dc": (["--arch", "transformer_dc"], []),
}
ALL_KEYS = {k for _, keys in CONFIGS.values() for k in keys}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _toy_lengths(toy_corpus):
    """Longest source and target sentence of the toy corpus, in words."""
    longest = 0
    for split in ("train", "valid"):
        for lang in ("src", "tgt"):
            with open(os.path.join(toy_corpus, f"{split}.{lang}")) as f:
                longest = max([longest] + [len(line.split()) for line in f])
    return longest


def _share_with_context(toy_corpus, split, side):
    """Share of the tokens (words + ``</s>``) of ``split``'s ``side`` that
    belong to sentences that are not the first of their document (the only
    sentences without context, with previous-sentence or online context)."""
    with open(os.path.join(toy_corpus, f"{split}.docids")) as f:
        docs = [line.strip() for line in f]
    with open(os.path.join(toy_corpus, f"{split}.{side}")) as f:
        lengths = [len(line.split()) + 1 for line in f]
    assert len(docs) == len(lengths)
    first = [i == 0 or docs[i] != docs[i - 1] for i in range(len(docs))]
    with_ctx = sum(n for n, f in zip(lengths, first) if not f)
    return with_ctx / sum(lengths)


# --------------------------------------------------------------------------- fairseq-train


def _train_logs(toy_bin, save_dir, opts, caplog, criterion="label_smoothed_cross_entropy_ctx"):
    """fairseq-train (2 updates, validation at the end, JSON logs every
    update); returns {tag: [stats dicts]} for train_inner, train, valid."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train([toy_bin, *opts, *TINY_MODEL_ARGS, "--share-all-embeddings",
               "--criterion", criterion, "--label-smoothing", "0.1",
               "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "600",
               "--max-update", "2", "--save-dir", save_dir, "--no-save",
               "--log-format", "json", "--log-interval", "1", "--seed", "1",
               "--num-workers", "0"])
    logs = {}
    for rec in caplog.records:
        if rec.name in ("train_inner", "train", "valid"):
            msg = rec.getMessage()
            if msg.startswith("{"):
                logs.setdefault(rec.name, []).append(json.loads(msg))
    return logs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_statistics_in_fairseq_train_logs(name, toy_bin, toy_corpus, tmp_path, caplog):
    opts, keys = CONFIGS[name]
    logs = _train_logs(toy_bin, str(tmp_path), opts, caplog)
    assert len(logs.get("train_inner", [])) == 2, logs.keys()
    assert logs.get("train") and logs.get("valid")
    longest = _toy_lengths(toy_corpus)
    for tag in ("train_inner", "train", "valid"):
        for stats in logs[tag]:
            prefix = "" if tag == "train_inner" else f"{tag}_"
            assert f"{prefix}loss" in stats
            got = {k[len(prefix):] for k in stats} & ALL_KEYS
            assert got == set(keys), (tag, stats)
            assert not any("ctxstat" in k for k in stats)  # sums and counts stay hidden
            v = {k: float(stats[prefix + k]) for k in keys}
            for k, x in v.items():
                assert math.isfinite(x), (tag, k, x)  # a count of 0 would give nan
                if k.startswith("gate") or k in ("ctx_mass", "ctx_frac"):
                    assert 0.0 <= x <= 1.0, (tag, k, x)
            if "ctx_mass" in v:
                assert v["gate"] + v["ctx_mass"] == pytest.approx(1.0, abs=1e-5)
            if "ctx_frac" in v:
                # a training batch may hold only sentences with context; the
                # validation set as a whole has its documents' first sentences too
                assert 0.0 < v["ctx_frac"] <= 1.0
            if tag == "valid" and "ctx_frac" in v:
                # pooled over the whole validation set: exactly the share of its
                # tokens in sentences that are not first in their document
                side = "tgt" if name.startswith("selective_dec") else "src"
                assert v["ctx_frac"] == pytest.approx(
                    _share_with_context(toy_corpus, "valid", side), abs=1e-5)
            if "sent_support" in v:
                # >= 1 sentence selected among the visible ones (online, documents
                # of 8 sentences: at most 7)
                assert 1.0 <= v["sent_support"] <= v["sent_visible"] + 1e-6
                assert v["sent_visible"] <= 7.0
            if "word_support" in v:
                assert 1.0 <= v["word_support"] <= longest
            if "word_overflow" in v:
                # no word capacity by default (--doc-word-capacity 0): exact
                assert v["word_overflow"] == 0.0
            if name == "selective_flat_sentence":  # softmax: every visible sentence
                assert v["sent_support"] == pytest.approx(v["sent_visible"], rel=1e-5)


# --------------------------------------------------------------------------- in-process helpers

PLAIN_CONFIGS = {
    "transformer": ["--arch", "transformer"],
    "hybrid_concat": ["--arch", "transformer_hybrid", "--hybrid-mode", "concat"],  # no gate
    **{name: opts for name, (opts, _) in CONFIGS.items()},
}
#: models without statistics: the criterion is exactly label_smoothed_cross_entropy
NO_STATISTICS = ("transformer", "hybrid_concat", "dc")


def _setup(toy_bin, opts, split="valid"):
    """(task, model, first batch of ``split``) as fairseq-train builds them,
    with the criterion options of the tests."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["--user-dir", USER_DIR, toy_bin, *opts, *TINY_MODEL_ARGS, "--share-all-embeddings",
         "--criterion", "label_smoothed_cross_entropy_ctx", "--label-smoothing", "0.1",
         "--report-accuracy", "--max-tokens", "600", "--seed", "1"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(split)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    assert type(criterion) is LabelSmoothedCrossEntropyCtxCriterion
    itr = task.get_batch_iterator(task.dataset(split), max_tokens=600, seed=1,
                                  num_workers=0).next_epoch_itr(shuffle=False)
    return task, model, criterion, next(iter(itr))


def _parent(task):
    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                              ignore_prefix_size=0, report_accuracy=True)


def _loss_and_grads(model, criterion, sample):
    model.zero_grad()
    torch.manual_seed(7)  # the same dropout masks for both criteria
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), sample_size, log, grads


# --------------------------------------------------------------------------- loss and gradients


@pytest.mark.parametrize("name", list(PLAIN_CONFIGS))
def test_same_loss_gradients_and_logs_as_label_smoothed_cross_entropy(name, toy_bin):
    task, model, ctx, sample = _setup(toy_bin, PLAIN_CONFIGS[name])
    model.train()  # dropout on: recording must not change the forward pass either
    ref_loss, ref_size, ref_log, ref_grads = _loss_and_grads(model, _parent(task), sample)
    loss, size, log, grads = _loss_and_grads(model, ctx, sample)
    assert torch.equal(loss, ref_loss) and size == ref_size
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for n in grads:
        assert torch.equal(grads[n], ref_grads[n]), n
    for k, v in ref_log.items():  # fairseq's entries, unchanged
        assert float(log[k]) == float(v), k
    extra = set(log) - set(ref_log)
    assert all(k.startswith("ctxstat/") for k in extra)
    if name in NO_STATISTICS:
        assert not extra
        with metrics.aggregate(new_root=True) as a:
            LabelSmoothedCrossEntropyCtxCriterion.reduce_metrics([log])
        with metrics.aggregate(new_root=True) as b:
            LabelSmoothedCrossEntropyCriterion.reduce_metrics([ref_log])
        assert a.get_smoothed_values() == b.get_smoothed_values()
    else:
        assert extra == {f"ctxstat/{k}/{p}" for k in CONFIGS[name][1] for p in ("sum", "count")}
        # 0-d float64 tensors, never read back in the training step (reduce_metrics reads them)
        assert all(torch.is_tensor(log[k]) and log[k].dim() == 0 and
                   log[k].dtype == torch.float64 and not log[k].requires_grad for k in extra)
    # validation (eval mode, no gradients) through the task
    model.eval()
    with torch.no_grad():
        _, _, vlog = task.valid_step(sample, model, ctx)
    assert set(vlog) == set(log)


# --------------------------------------------------------------------------- statistics


def _stat(log, key):
    return float(log[f"ctxstat/{key}/sum"]), float(log[f"ctxstat/{key}/count"])


@pytest.mark.parametrize("name", ["context_aware", "hybrid"])
def test_statistics_add_no_host_reads_and_log_the_same_values(name, toy_bin):
    """The statistics stay on the device in the training step (no read back
    to the host between the forward and the backward pass: as many host
    reads as label_smoothed_cross_entropy), and the metrics reduce_metrics
    logs from them are those of the statistics read back as floats (the
    former logging output), bit for bit, over several batches."""
    from ctx_fairseq.host_reads import HostReadCounter

    task, model, ctx, sample = _setup(toy_bin, CONFIGS[name][0])
    model.train()

    def reads(criterion):
        model.zero_grad()
        torch.manual_seed(7)
        with HostReadCounter() as r:
            loss, _, log = criterion(model, sample)
            loss.backward()
        return r.total, log

    ctx_reads, _ = reads(ctx)
    plain_reads, _ = reads(_parent(task))
    assert ctx_reads == plain_reads
    model.eval()
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=200, seed=1, num_workers=0,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    logs, floats = [], []
    with torch.no_grad():
        for sample in list(itr)[:4]:
            _, _, log = ctx(model, sample)
            logs.append(log)
            floats.append({k: (v.tolist() if torch.is_tensor(v) else v) for k, v in log.items()})
    assert len(logs) >= 2 and any("ctxstat/" in k for k in logs[0])
    keys, h = CONFIGS[name][1], len(logs) // 2
    for got, want in ((_reduced(logs), _reduced(floats)),
                      (_reduced(logs[:h], logs[h:]), _reduced(floats[:h], floats[h:]))):
        assert [got[k] for k in keys] == [want[k] for k in keys]


def test_hybrid_gates_are_the_mean_over_real_tokens(toy_bin):
    from ctx_fairseq.models.transformer_hybrid import hybrid_attention_modules

    _, model, ctx, sample = _setup(toy_bin, CONFIGS["hybrid"][0])
    with torch.no_grad():  # a non-trivial gate (the gate weights start at 0: g = 0.5)
        for _, m in hybrid_attention_modules(model):
            m.gate_proj.weight.normal_(0.0, 0.5)
    model.eval()
    _, _, log = ctx(model, sample)
    mods = hybrid_attention_modules(model)
    assert all(not m.record_gates and m.last_gate is None for _, m in mods)  # off again
    # the same forward pass, gates recorded by the analysis hook
    for _, m in mods:
        m.record_gates = True
    model(**sample["net_input"])
    ni, pad = sample["net_input"], model.encoder.padding_idx
    assert ni["src_tokens"].eq(pad).any() and ni["prev_output_tokens"].eq(pad).any()
    for name, m in mods:
        side, layer = name.split(".")
        tokens = ni["src_tokens"] if side == "encoder" else ni["prev_output_tokens"]
        real = tokens.ne(pad).t()  # T x B
        g = m.last_gate.double().mean(-1)  # heads averaged (--hybrid-gate-per-head)
        total, count = _stat(log, f"gate_{side[:3]}{layer}")
        assert count == float(real.sum())
        assert total == pytest.approx(float(g[real].sum()), rel=1e-9)
        assert total / count != pytest.approx(float(g.mean()), rel=1e-6)  # padding left out
        m.record_gates = False


def test_context_aware_gate_over_tokens_with_context(toy_bin):
    _, model, ctx, sample = _setup(toy_bin, CONFIGS["context_aware"][0])
    model.eval()
    _, _, log = ctx(model, sample)
    layer = model.encoder.context_aware_layer
    assert not layer.record_statistics and layer.last_statistics is None
    layer.record = True  # the analysis hook: the same forward pass, gate kept
    model(**sample["net_input"])
    layer.record = False
    ni, pad = sample["net_input"], model.encoder.padding_idx
    has_ctx = ni["src_ctx_tokens"].ne(pad).any(1)
    assert 0 < int(has_ctx.sum()) < has_ctx.numel()  # both kinds of sentences
    real = ni["src_tokens"].ne(pad).t()
    with_ctx = real & has_ctx.view(1, -1)
    g = layer.last_gate.double().mean(-1)
    gate_sum, n_ctx = _stat(log, "gate")
    assert n_ctx == float(with_ctx.sum())
    assert gate_sum == pytest.approx(float(g[with_ctx].sum()), rel=1e-9)
    mass_sum, n = _stat(log, "ctx_mass")
    assert n == n_ctx and mass_sum == pytest.approx(float((1 - g)[with_ctx].sum()), rel=1e-9)
    assert _stat(log, "ctx_frac") == (float(with_ctx.sum()), float(real.sum()))
    # without the criterion, nothing is recorded
    model(**ni)
    assert layer.last_statistics is None


@pytest.mark.parametrize("name", ["selective_enc", "selective_dec_sparse"])
def test_selective_statistics(name, toy_bin):
    _, model, ctx, sample = _setup(toy_bin, CONFIGS[name][0])
    model.eval()
    _, _, log = ctx(model, sample)
    part = model._context_part()
    assert not part.record_statistics
    model(**sample["net_input"])
    assert "gate_sum" not in part.last_info  # nothing extra without the criterion
    part.record_stats = True  # the analysis hook: the same forward pass, info kept
    model(**sample["net_input"])
    part.record_stats = False
    info = part.last_info
    ni, pad = sample["net_input"], model.encoder.padding_idx
    decoder = name.startswith("selective_dec")
    real = (ni["prev_output_tokens"] if decoder else ni["src_tokens"]).ne(pad).t()  # T x B
    # online: a sentence sees every earlier sentence of its document (none is empty)
    pos = ni["query_pos"]
    assert torch.equal(info["has_context"], pos > 0)
    assert bool((pos == 0).any()) and bool((pos > 0).any())
    with_ctx = real & (pos > 0).view(1, -1)
    n_ctx = float(with_ctx.sum())
    g = info["gate"].double().mean(-1)
    gate_sum, count = _stat(log, "gate")
    assert count == n_ctx and gate_sum == pytest.approx(float(g[with_ctx].sum()), rel=1e-9)
    assert _stat(log, "ctx_frac") == (n_ctx, float(real.sum()))
    heads = model.args.encoder_attention_heads if not decoder else \
        model.args.decoder_attention_heads
    visible, n_th = _stat(log, "sent_visible")
    assert n_th == n_ctx * heads
    assert visible == float((with_ctx.double() * pos.double().view(1, -1)).sum()) * heads
    support, n = _stat(log, "sent_support")
    assert n == n_th and n_th <= support <= visible
    assert support / n == pytest.approx(float(info["sentence_support"]), rel=1e-9)
    words, pairs = _stat(log, "word_support")
    assert pairs == float(info["num_support_pairs"]) and pairs >= support
    assert words / pairs == pytest.approx(float(info["word_support"]), rel=1e-9)
    assert pairs <= words
    over, n = _stat(log, "word_overflow")
    assert n == n_th and over == float(info["word_overflow_sum"]) == 0.0


def test_selective_word_capacity_is_exact_now(toy_bin, caplog):
    """The removed opt-in capacity (--doc-word-capacity 1, from an old command
    line or checkpoint) builds the exact model, with a warning: the word level
    is streamed over every sentence, ``word_overflow`` is 0 and the loss is
    the model's without the option."""
    import logging

    with caplog.at_level(logging.WARNING):
        _, model, ctx, sample = _setup(toy_bin, [*CONFIGS["selective_enc"][0],
                                                 "--doc-word-capacity", "1"])
    assert "capacity was removed" in caplog.text
    assert model._context_part().context_layer.context_attn.word_capacity == 0
    _, plain, _, _ = _setup(toy_bin, CONFIGS["selective_enc"][0])
    plain.load_state_dict(model.state_dict())
    model.eval()
    plain.eval()
    loss, _, log = ctx(model, sample)
    loss_plain, _, _ = ctx(plain, sample)
    assert float(loss) == float(loss_plain)
    over, n = _stat(log, "word_overflow")
    assert over == 0.0 and n > 0


# --------------------------------------------------------------------------- aggregation


def _log(gate_sum, gate_count, ntokens=10):
    return {"loss": 2.0 * ntokens, "nll_loss": 1.5 * ntokens, "ntokens": ntokens,
            "nsentences": 2, "sample_size": ntokens,
            "ctxstat/gate/sum": gate_sum, "ctxstat/gate/count": gate_count,
            "ctxstat/sent_support/sum": 3.0 * gate_count, "ctxstat/sent_support/count": gate_count}


def _reduced(*calls):
    with metrics.aggregate(new_root=True) as agg:
        for logs in calls:
            LabelSmoothedCrossEntropyCtxCriterion.reduce_metrics(logs)
    return agg.get_smoothed_values()


def test_pooled_mean_over_batches_and_workers():
    a, b = _log(0.9, 1.0), _log(2.0, 10.0)  # batch means 0.9 and 0.2
    pooled = (0.9 + 2.0) / 11.0  # a mean of means would be 0.55
    # one call with both outputs (gradient accumulation / all-gathered workers),
    # two calls into one logging interval (two updates), and the outputs summed
    # beforehand (fairseq's fast stat sync across workers) all give the pooled mean
    summed = {k: a[k] + b[k] for k in a}
    for values in (_reduced([a, b]), _reduced([a], [b]), _reduced([summed])):
        assert values["gate"] == pytest.approx(pooled, rel=1e-12)
        assert values["sent_support"] == pytest.approx(3.0, rel=1e-12)
        assert values["loss"] == _reduced([a, b])["loss"]  # fairseq's metrics as before
        assert not any(k.startswith("_") or "ctxstat" in k for k in values)
    assert LabelSmoothedCrossEntropyCtxCriterion.logging_outputs_can_be_summed()
    # no token with context in the interval: undefined, not 0
    assert math.isnan(_reduced([_log(0.0, 0.0)])["gate"])
    # a logging output without statistics (sentence-level model) adds no key
    plain = {k: v for k, v in a.items() if not k.startswith("ctxstat/")}
    assert set(_reduced([plain])) == {"loss", "nll_loss", "ppl"}


def test_statistics_only_on_the_updates_of_the_interval(toy_bin):
    """``--context-stats-interval 3``: the document task tells the criterion
    which update it trains; the statistics (and the model's work for them)
    come on updates 3, 6, ... only; validation always computes them; the
    default computes them on every update; 0 is an error."""
    from test_host_reads import _Backward

    task, model, criterion, sample = _setup(
        toy_bin, CONFIGS["selective_enc"][0] + ["--context-stats-interval", "3"], split="train")
    assert criterion.context_stats_interval == 3
    record = []
    layer = model.encoder
    real_forward = layer.context_layer.forward

    def spy(*a, **k):
        record.append(bool(k.get("return_stats")))
        return real_forward(*a, **k)

    layer.context_layer.forward = spy
    model.train()
    logs = []
    for update in range(6):
        torch.manual_seed(7)
        loss, _, log = task.train_step(sample, model, criterion, _Backward(), update)
        logs.append(log)
    assert record == [False, False, True, False, False, True]
    assert [any(k.startswith("ctxstat/") for k in log) for log in logs] == record
    model.eval()
    record.clear()
    _, _, log = task.valid_step(sample, model, criterion)
    assert record == [True] and any(k.startswith("ctxstat/") for k in log)
    with pytest.raises(ValueError, match="--context-stats-interval 0"):
        LabelSmoothedCrossEntropyCtxCriterion(task, False, 0.1, context_stats_interval=0)
    assert LabelSmoothedCrossEntropyCtxCriterion(task, False, 0.1).statistics_due(model)
