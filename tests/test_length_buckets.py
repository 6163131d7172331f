"""``--length-buckets`` (issue 24): a document-memory batch's sentences in
groups of similar length, the sentence-level layers of
``transformer_selective_doc`` run per group. The grouping (optimal for the
sorted order, a permutation and its inverse, widths that hold every row), the
model's outputs and gradients equal to the one-group batch's (encoder and
decoder integration, online and offline, left- and right-padded), incremental
decoding unchanged, and the errors for batches it does not apply to."""

import contextlib
import itertools

import numpy as np

import pytest
import torch

from ctx_fairseq.data.memory_index import length_buckets
from ctx_fairseq.errors import InputError
from selective_doc_utils import build, corpus, dataset, enc_input, setup_task

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.exactness]


def _cost(src, tgt, groups):
    return sum(len(g) * (src[g].max() + tgt[g].max()) for g in groups)


def _groups(out):
    rows, shape = out["query_bucket_rows"].numpy(), out["query_bucket_shape"]
    bounds = np.cumsum(np.r_[0, shape[:, 0]])
    return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_groups_are_optimal_for_the_sorted_order(seed, k):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    src, tgt = rng.integers(1, 20, n), rng.integers(1, 20, n)
    out = length_buckets(src, tgt, k, int(src.max()), int(tgt.max()))
    groups = _groups(out)
    rows = out["query_bucket_rows"].numpy()
    assert sorted(rows.tolist()) == list(range(n))  # a permutation of the batch
    assert np.array_equal(rows[out["query_bucket_restore"].numpy()], np.arange(n))
    assert 1 <= len(groups) <= k
    for g, (count, sw, tw) in zip(groups, out["query_bucket_shape"]):
        assert count == len(g) and sw == src[g].max() and tw == tgt[g].max()
    # brute force over every cut of the sorted order into at most k groups
    order = np.lexsort((tgt, src))
    best = min(_cost(src, tgt, np.split(order, list(cuts)))
               for m in range(min(k, n)) for cuts in itertools.combinations(range(1, n), m))
    assert _cost(src, tgt, groups) == best


@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
@pytest.mark.parametrize("seed", range(4))
def test_the_target_index_picks_the_real_target_tokens_of_the_groups(seed, left):
    """``query_bucket_target_index``: in the groups' layout (each group's
    rows cut to its target width, row by row, group after group) exactly
    the real target tokens, in that order."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    src, tgt = rng.integers(1, 20, n), rng.integers(1, 20, n)
    T = int(tgt.max()) + 3  # the batch padded wider than its longest row, rounded to 4
    out = length_buckets(src, tgt, 3, int(src.max()), T, multiple=4, left_pad_target=left)
    target = np.zeros((n, T), dtype=np.int64)  # 0: padding
    for i in range(n):
        real = np.arange(1, tgt[i] + 1) + 100 * i
        if left:
            target[i, T - tgt[i]:] = real
        else:
            target[i, :tgt[i]] = real
    layout = np.concatenate([
        (target[g][:, T - tw:] if left else target[g][:, :tw]).reshape(-1)
        for g, (_, _, tw) in zip(_groups(out), out["query_bucket_shape"])])
    picked = layout[out["query_bucket_target_index"].numpy()]
    expected = np.concatenate([target[r][target[r] != 0] for r in out["query_bucket_rows"]])
    assert np.array_equal(picked, expected)


def test_widths_round_up_to_the_multiple_within_the_batch():
    out = length_buckets(np.array([3, 9, 10]), np.array([2, 9, 11]), 2, 16, 16, multiple=8)
    assert out["query_bucket_shape"].tolist() == [[1, 8, 8], [2, 16, 16]]


def _model_and_batches(integration, mode, left_pad_source, k=3):
    model, d = build(["--context-memory", "frozen"], integration=integration, mode=mode,
                     left_pad_source=left_pad_source)
    model.train()  # dropout is off in these tiny models; the training path runs
    # lengths far apart, two documents
    data = corpus(d, [5, 4], lengths=[2, 11, 3, 7, 2, 12, 2, 5, 9])
    out = []
    for buckets in (1, k):
        ds = dataset(d, data, mode, integration, left_pad_source)
        ds.length_buckets = buckets
        ds.set_context_layout(model.context_layout)
        out.append(ds.collater([ds[i] for i in range(len(ds))]))
    return model, d, out


def _loss_and_grads(model, batch, d):
    model.zero_grad()
    ni = batch["net_input"]
    logits, _ = model(**ni)
    real = batch["target"].ne(d.pad())
    lp = torch.log_softmax(logits, -1).gather(-1, batch["target"].unsqueeze(-1)).squeeze(-1)
    loss = -(lp * real).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), real, grads


@pytest.mark.parametrize("left_pad_source", [True, False], ids=["left-pad", "right-pad"])
@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_grouped_equals_one_group(integration, mode, left_pad_source):
    model, d, (whole, grouped) = _model_and_batches(integration, mode, left_pad_source)
    assert len(grouped["net_input"]["query_bucket_shape"]) > 1
    assert "query_bucket_rows" not in whole["net_input"]
    a, real, ga = _loss_and_grads(model, whole, d)
    b, _, gb = _loss_and_grads(model, grouped, d)
    assert (a - b)[real].abs().max() < 1e-10  # float64 models
    assert set(ga) == set(gb) and len(ga) > 10
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() < 1e-10, n


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_groups_run_the_layers_once_per_group(integration, monkeypatch):
    """The encoder runs once per group at the group's width; so does the
    decoder with encoder integration (its context layer, with decoder
    integration, reads whole documents: one call)."""
    from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase

    model, d, (whole, grouped) = _model_and_batches(integration, "online", True)
    calls = {"enc": [], "dec": []}
    real_enc = TransformerEncoderBase.forward_scriptable
    real_dec = TransformerDecoderBase.extract_features_scriptable

    def spy_enc(self, src_tokens, *args, **kwargs):
        if self is model.encoder:
            calls["enc"].append(tuple(src_tokens.shape))
        return real_enc(self, src_tokens, *args, **kwargs)

    def spy_dec(self, prev, encoder_out, *args, **kwargs):
        if self is model.decoder:
            calls["dec"].append(tuple(prev.shape) + (encoder_out["encoder_out"][0].size(0),))
        return real_dec(self, prev, encoder_out, *args, **kwargs)

    monkeypatch.setattr(TransformerEncoderBase, "forward_scriptable", spy_enc)
    monkeypatch.setattr(TransformerDecoderBase, "extract_features_scriptable", spy_dec)
    with torch.no_grad():
        model(**grouped["net_input"])
    shape = grouped["net_input"]["query_bucket_shape"]
    assert calls["enc"] == [(int(n), int(w)) for n, w, _ in shape]
    ni = whole["net_input"]
    if integration == "encoder":
        assert calls["dec"] == [(int(n), int(t), int(s)) for n, s, t in shape]
    else:
        assert calls["dec"] == [tuple(ni["prev_output_tokens"].shape)
                                + (ni["src_tokens"].size(1),)]


def test_incremental_decoding_drops_the_groups():
    """Beam search reorders the rows: the groups index the batch's rows, so
    they are dropped with the other row indexes, and the decoder's full
    forward on the reordered output runs as one group."""
    model, d, (whole, grouped) = _model_and_batches("encoder", "online", True)
    model.eval()
    with torch.no_grad():
        enc = model.encoder(**enc_input(grouped["net_input"]))
        assert "query_bucket_shape" in enc
        order = torch.arange(enc["encoder_out"][0].size(1))
        re = model.encoder.reorder_encoder_out(enc, order)
        assert not any(k.startswith("query_bucket") for k in re)
        prev = grouped["net_input"]["prev_output_tokens"]
        full_grouped, _ = model.decoder(prev, enc)
        full_whole, _ = model.decoder(prev, re)
    real = grouped["target"].ne(d.pad())
    assert (full_grouped - full_whole)[real].abs().max() < 1e-10


def test_a_shared_memory_is_refused():
    model, d = build(["--context-memory", "shared"])
    ds = dataset(d, corpus(d, [3]))
    ds.length_buckets = 2
    ds.set_context_layout(model.context_layout)
    with pytest.raises(ValueError, match="--length-buckets.*shared memory"):
        ds.collater([ds[i] for i in range(len(ds))])


def test_the_task_refuses_buckets_without_a_document_memory(toy_bin):
    with pytest.raises(InputError, match="--length-buckets.*--document-memory"):
        setup_task(toy_bin, "--source-context-size", "1", "--length-buckets", "2")
    with pytest.raises(InputError, match="--length-buckets must be >= 1"):
        setup_task(toy_bin, "--document-context", "online", "--document-memory",
                   "--length-buckets", "0")


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
def test_the_loss_on_grouped_logits_equals_the_padded_loss(integration):
    """label_smoothed_cross_entropy_ctx asks for grouped logits (targets
    grouped alike by ``get_targets``): loss, nll_loss, accuracy and every
    gradient equal those of the one-group batch; the switch is off after."""
    from argparse import Namespace

    from ctx_fairseq.criterions.label_smoothed_cross_entropy_ctx import (
        LabelSmoothedCrossEntropyCtxCriterion,
    )

    model, d, (whole, grouped) = _model_and_batches(integration, "offline", True)
    task = Namespace(target_dictionary=d, cfg=Namespace())
    crit = LabelSmoothedCrossEntropyCtxCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                 report_accuracy=True)
    outs = []
    for batch in (whole, grouped):
        model.zero_grad()
        loss, size, log = crit(model, batch)
        loss.backward()
        outs.append((loss.detach(), log, {n: p.grad.clone() for n, p in
                                          model.named_parameters() if p.grad is not None}))
        assert model.decoder.grouped_logits is False
    (la, loga, ga), (lb, logb, gb) = outs
    # the same terms summed in another order (fairseq's log-softmax is float32)
    assert abs(float(la - lb)) <= 1e-6 * abs(float(la))
    assert abs(float(loga["nll_loss"] - logb["nll_loss"])) <= 1e-6 * abs(float(loga["nll_loss"]))
    assert int(loga["n_correct"]) == int(logb["n_correct"])
    assert int(loga["total"]) == int(logb["total"])
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 1e-6 * max(1.0, float(ga[n].abs().max())), n
    # the grouped layout itself: M x 1 x V with the targets alike
    model.grouped_logits(True)
    try:
        with torch.no_grad():
            out = model(**grouped["net_input"])
    finally:
        model.grouped_logits(False)
    if integration == "encoder":  # the output layer ran on the real target tokens only
        m = int(grouped["target"].ne(d.pad()).sum())
        assert out[0].shape == (m, 1, len(d))
        target = model.get_targets(grouped, out)
        assert target.shape == (m, 1) and bool(target.ne(d.pad()).all())
        assert sorted(target.view(-1).tolist()) == sorted(
            grouped["target"][grouped["target"].ne(d.pad())].tolist())
    else:  # decoder integration: the decoder runs whole, padded as usual
        assert out[0].shape[:2] == grouped["target"].shape


@pytest.mark.parametrize("integration", ["encoder", "decoder"])
@pytest.mark.parametrize("mode", ["online", "offline"])
def test_the_cpus_shortcuts_equal_the_accelerators_path(integration, mode):
    """On the CPU the model computes less: the word level's compacted tiles,
    the FFN and the context layer's position-wise part on the real tokens,
    the output layer on the real targets. Against the accelerator's path
    (the selected sentences, the padded groups, logits in batch order): the
    loss and every gradient, float64."""
    from ctx_fairseq.modules.cpu_shortcuts import accelerator_path

    model, d, (_, grouped) = _model_and_batches(integration, mode, True)
    res = []
    for accelerator in (False, True):
        model.zero_grad()
        model.grouped_logits(not accelerator)
        try:
            with (accelerator_path() if accelerator else contextlib.nullcontext()):
                out = model(**grouped["net_input"])
        finally:
            model.grouped_logits(False)
        target = model.get_targets(grouped, out).reshape(-1)
        lp = torch.log_softmax(out[0].reshape(target.numel(), -1), -1)
        real = target.ne(d.pad())
        loss = -(lp.gather(1, target.unsqueeze(1)).squeeze(1) * real).sum()
        loss.backward()
        res.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}))
    (la, ga), (lb, gb) = res
    assert abs(la - lb) < 1e-9 * abs(la)
    assert ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=0, atol=1e-10, msg=n)


def test_the_model_refuses_buckets_with_a_shared_memory(toy_bin):
    task, cfg = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                           "--length-buckets", "2", "--context-memory", "shared")
    with pytest.raises(ValueError, match="--length-buckets needs --context-memory frozen"):
        task.build_model(cfg.model)
