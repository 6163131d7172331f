"""Concatenation baseline (--concat-context): sequences, lengths, training,
generation (only the current sentence's translation is kept), own target
context in document order, contrastive scoring of the current sentence only,
loss weighting."""

import math
import os
import re
import sys

import numpy as np
import pytest
import torch

from fairseq_cli_utils import TINY_MODEL_ARGS, generate, train

CONCAT = ["--task", "document_translation", "--concat-context", "--source-context-size", "1"]
CONCAT22 = CONCAT + ["--target-context-size", "1"]


def _task(toy_bin, *extra):
    from fairseq import options, tasks

    import ctx_fairseq  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [toy_bin, "--arch", "transformer", *extra])
    return tasks.setup_task(args)


def test_sequences_and_lengths(toy_bin):
    task = _task(toy_bin, *CONCAT22, "--max-source-positions", "1024")
    task.load_dataset("test")
    ds = task.datasets["test"]
    d = task.source_dictionary
    brk = d.index("<brk>")
    assert brk != d.unk() and task.target_dictionary.index("<brk>") == brk
    inner = ds.inner
    for i in range(len(ds)):
        item = ds[i]
        src, tgt = item["source"], item["target"]
        base_src, base_tgt = inner.base.src[i], inner.base.tgt[i]
        assert torch.equal(src[-len(base_src):], base_src)
        assert torch.equal(tgt[-len(base_tgt):], base_tgt)
        pos = int(inner.sent_pos[i])
        if pos == 0:  # first sentence of its document: no context, no break
            assert torch.equal(src, base_src) and item["prefix_len"] == 0
        else:  # the previous sentence of the same document, then the break
            prev_s, prev_t = inner.base.src[i - 1], inner.base.tgt[i - 1]
            assert torch.equal(src[:-len(base_src)], torch.cat([prev_s[:-1], torch.tensor([brk])]))
            assert torch.equal(tgt[:-len(base_tgt)], torch.cat([prev_t[:-1], torch.tensor([brk])]))
            assert item["prefix_len"] == len(prev_t)
        assert ds.size(i) == (len(src), len(tgt))
        assert ds.num_tokens(i) == max(len(src), len(tgt))
    b = ds.collater([ds[i] for i in range(6)])
    assert set(b["net_input"]) == {"src_tokens", "src_lengths", "prev_output_tokens"}
    assert b["target_prefix_len"].tolist() == [ds[i]["prefix_len"] for i in b["id"].tolist()]


def test_context_is_cut_to_leave_room_for_the_sentence(toy_bin):
    task = _task(toy_bin, *CONCAT22, "--source-context-size", "3", "--target-context-size", "3",
                 "--max-source-positions", "14", "--max-target-positions", "14")
    task.load_dataset("test")
    ds = task.datasets["test"]
    cut = 0
    for i in range(len(ds)):
        item = ds[i]
        assert len(item["source"]) <= 14 and len(item["target"]) <= 14
        cut += int(ds.inner.sent_pos[i] > 0 and item["source"].numel() ==
                   ds.inner.base.src[i].numel())
    assert ds.truncation["src"][1] > 0  # context was cut, and it is reported


def test_options_are_checked(toy_bin):
    with pytest.raises(ValueError, match="previous sentences only"):
        _task(toy_bin, *CONCAT, "--context-direction", "both")
    with pytest.raises(ValueError, match="would add no context"):
        _task(toy_bin, "--task", "document_translation", "--concat-context",
              "--source-context-size", "0")
    with pytest.raises(ValueError, match="goes with --concat-context"):
        _task(toy_bin, "--task", "document_translation", "--concat-context-loss-weight", "0.5")


@pytest.fixture(scope="module")
def concat_ckpt(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("concat"))
    train([toy_bin, "--arch", "transformer", *TINY_MODEL_ARGS, *CONCAT22,
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "2e-3",
           "--max-tokens", "600", "--max-update", "30", "--save-dir", save, "--no-epoch-checkpoints",
           "--criterion", "label_smoothed_cross_entropy_ctx", "--label-smoothing", "0.1",
           "--num-workers", "0", "--seed", "1", "--no-progress-bar"])
    return os.path.join(save, "checkpoint_last.pt")


def _hyps(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}


def _refs(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^T-(\d+)\t(.*)$", out, re.M)}


def test_generation_keeps_only_the_current_sentence(concat_ckpt, toy_bin, toy_corpus):
    gen = [toy_bin, "--path", concat_ckpt, *CONCAT22, "--beam", "2", "--max-tokens", "600",
           "--gen-subset", "test", "--num-workers", "0"]
    with pytest.raises(ValueError, match="needs the target context"):
        generate(gen)
    out = generate(gen + ["--gold-target-context"])
    hyps, refs = _hyps(out), _refs(out)
    tgt = open(os.path.join(toy_corpus, "test.tgt")).read().splitlines()
    assert len(hyps) == len(tgt) and set(refs) == set(hyps)
    for i, ref in refs.items():  # the reference printed is the current sentence alone
        assert ref == tgt[i]
    for h in hyps.values():  # nothing of the context leaks into a hypothesis
        assert "<brk>" not in h
    # the model's own outputs as target context, in document order
    own = generate(gen + ["--own-target-context"])
    own_h = _hyps(own)
    assert set(own_h) == set(hyps) and all("<brk>" not in h for h in own_h.values())
    with pytest.raises(ValueError, match="choose one source of target context"):
        generate(gen + ["--own-target-context", "--gold-target-context"])


def test_own_target_context_uses_the_previous_hypotheses(concat_ckpt, toy_bin, monkeypatch):
    """The prefix forced for sentence i is the hypothesis printed for i-1."""
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    seen = {}
    real = DocumentTranslationTask._concat_step

    def spy(self, generator, models, sample, prefix_tokens, constraints, plen=None):
        d = self.target_dictionary
        lengths = sample["target_prefix_len"].tolist()
        assert plen is None or plen == lengths
        for i, p, n in zip(sample["id"].tolist(), sample["target_prefix"], lengths):
            seen[i] = d.string(p[:n])
        return real(self, generator, models, sample, prefix_tokens, constraints, plen)

    monkeypatch.setattr(DocumentTranslationTask, "_concat_step", spy)
    out = generate([toy_bin, "--path", concat_ckpt, *CONCAT22, "--beam", "1", "--max-tokens", "600",
                    "--gen-subset", "test", "--num-workers", "0", "--own-target-context"])
    hyps = _hyps(out)
    task = _task(toy_bin, *CONCAT22)
    task.load_dataset("test")
    pos = task.datasets["test"].inner.sent_pos
    checked = 0
    for i, prefix in seen.items():
        if pos[i] == 0:
            assert prefix == ""
        else:
            assert prefix == (hyps[i - 1] + " <brk>").strip()
            checked += 1
    assert checked > 10


def _per_length_reference(task, generator, models, sample):
    """The hypotheses as the task made them before issue 18: one call of the
    generator per distinct prefix length (fairseq's ``prefix_tokens``,
    ``--max-len-b`` and ``--min-len`` raised by the length)."""
    from fairseq.tasks.translation import TranslationTask

    from ctx_fairseq.data.concat_dataset import strip_prefix
    from ctx_fairseq.tasks.generation import select_rows

    plen = sample["target_prefix_len"].tolist()
    out = [None] * len(plen)
    for n in sorted(set(plen)):
        rows = [r for r, p in enumerate(plen) if p == n]
        sub = select_rows(sample, rows)
        saved = (generator.max_len_b, generator.min_len)
        generator.max_len_b, generator.min_len = saved[0] + n, saved[1] + n
        try:
            hypos = TranslationTask.inference_step(
                task, generator, models, sub, sub["target_prefix"][:, :n] if n else None)
        finally:
            generator.max_len_b, generator.min_len = saved
        for r, h in zip(rows, strip_prefix(hypos, [n] * len(rows), generator.len_penalty,
                                           generator.normalize_scores)):
            out[r] = h
    return out


@pytest.mark.parametrize("options", [["--beam", "2"],
                                     ["--beam", "3", "--max-len-b", "3", "--min-len", "2"],
                                     ["--beam", "4", "--max-len-b", "2", "--nbest", "4"]])
def test_one_generator_call_per_batch_equals_one_per_prefix_length(concat_ckpt, toy_bin,
                                                                    options):
    """The batch's rows of every prefix length in one call (ForcedPrefixes):
    the same hypotheses (every one of the beam: tokens, scores, positional
    scores) as one call per prefix length; the length limits bind in the
    second and third settings.

    Tolerance of the scores: the model runs in float64, but fairseq's
    ``SequenceGenerator`` accumulates a hypothesis's score in a float32
    buffer (``scores``), and the positional scores are differences of that
    buffer's entries. The two batchings give float64 log-probabilities that
    agree to about 1e-16 and may round to neighbouring float32 values: each
    of at most ``len(tokens)`` accumulations adds at most one float32 ulp
    (``2**-23`` relative) of the running score. So the scores agree within
    ``len(tokens) * 2**-23 * |score|`` (about 1e-5 for a 10-token
    hypothesis of score -50), not 1e-9."""
    from fairseq import checkpoint_utils, options as fairseq_options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_cli_utils import USER_DIR

    args = fairseq_options.parse_args_and_arch(fairseq_options.get_generation_parser(), [
        "--user-dir", USER_DIR, toy_bin, "--path", concat_ckpt, *CONCAT22,
        "--gold-target-context", "--gen-subset", "test", *options])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    models, saved = checkpoint_utils.load_model_ensemble([concat_ckpt], task=task)
    for m in models:
        m.double().eval()  # batch composition changes float32 sums in the last bit
    task.load_dataset("test", task_cfg=saved.task)
    gen = task.build_generator(models, cfg.generation)
    calls = []
    real = gen.generate

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    gen.generate = counted
    itr = task.get_batch_iterator(task.dataset("test"), max_tokens=600, max_positions=(
        utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models])
    )).next_epoch_itr(shuffle=False)
    lengths = rows = 0
    with torch.no_grad():
        for sample in itr:
            calls.clear()
            ours = task.inference_step(gen, models, sample)
            assert len(calls) == 1
            ref = _per_length_reference(task, gen, models, sample)
            lengths = max(lengths, len(set(sample["target_prefix_len"].tolist())))
            for a, b in zip(ours, ref):
                assert len(a) == len(b)
                for x, y in zip(a, b):
                    assert torch.equal(x["tokens"], y["tokens"])
                    # float32 accumulation (see the docstring)
                    tol = len(x["tokens"]) * 2.0 ** -23 * max(
                        1.0, float(x["positional_scores"].abs().sum()))
                    assert abs(float(x["score"]) - float(y["score"])) <= tol
                    assert float((x["positional_scores"] - y["positional_scores"]).abs().max()) \
                        <= 2 * tol
                    rows += 1
    assert lengths >= 4 and rows >= 48  # a batch of 4 prefix lengths or more


class _UniformEnsemble:
    """A generator's ``EnsembleModel`` stand-in: uniform log-probabilities."""

    def __init__(self, vocab):
        self.vocab = vocab

    def forward_decoder(self, tokens, *args, **kwargs):
        return torch.full((tokens.size(0), self.vocab), -math.log(self.vocab)), None

    def reorder_incremental_state(self, incremental_states, new_order):
        pass


class _LimitsGenerator:
    """The attributes of fairseq's ``SequenceGenerator`` that
    :class:`ForcedPrefixes` reads."""

    def __init__(self, max_len_b, min_len, max_len=1024, beam=2, vocab=12):
        self.beam_size, self.max_len_a, self.max_len_b = beam, 0, max_len_b
        self.max_len, self.min_len, self.eos = max_len, min_len, 2
        self.match_source_len, self.token_indices_to_suppress = False, None
        self.model = _UniformEnsemble(vocab)


def _prefix_sample(plen, ids, vocab=12):
    width = max(plen)
    prefix = torch.full((len(plen), width), 1, dtype=torch.long)
    for r, n in enumerate(plen):
        prefix[r, :n] = torch.arange(n) % (vocab - 4) + 4
    return {"id": torch.tensor(ids), "nsentences": len(plen),
            "net_input": {"src_tokens": torch.full((len(plen), 5), 4, dtype=torch.long)},
            "target_prefix": prefix, "target_prefix_len": torch.tensor(plen)}


def test_forced_prefixes_refuse_a_row_whose_minimum_length_exceeds_its_maximum():
    """A row with ``n + --min-len > min(max_len_a * src + max_len_b + n,
    max_len - 1)`` (fairseq's call per length asserted ``min_len <=
    max_len``): a clear error before generation naming the sentence and its
    lengths, not a row of ``-inf`` at its last step (a wrong translation).
    The boundary (equal lengths) is generated: the row's end of sentence
    comes exactly at its last step."""
    from ctx_fairseq.host_reads import HostReadCounter
    from ctx_fairseq.tasks.generation import ForcedPrefixes

    # the model's maximum target positions bind: max_len - 1 = 9; the row of a
    # 8-token context may end at step 9 at the latest but --min-len 2 needs 10
    gen = _LimitsGenerator(max_len_b=200, min_len=2, max_len=10)
    sample = _prefix_sample([3, 8, 0], ids=[41, 42, 43])
    with pytest.raises(RuntimeError) as e:
        ForcedPrefixes(gen, sample, [3, 8, 0])
    msg = str(e.value)
    assert "sentence 42 (batch row 1)" in msg and "8-token target context" in msg
    assert "--min-len 2 need at least 10" in msg and "at most 9 target tokens" in msg
    assert "maximum target positions 10" in msg
    # --max-len-b binds every row (3 + 3 > 2 + 3); the generator's own limits
    # (min_len 3 <= 2 + the longest prefix, 8) would not have caught it
    gen = _LimitsGenerator(max_len_b=2, min_len=3)
    with pytest.raises(RuntimeError, match=r"sentence 41 \(batch row 0\): its 3-token target "
                                           r"context and --min-len 3 need at least 6.*at most 5 "
                                           r"target tokens fit: min\(int\(--max-len-a 0 \* "
                                           r"source length 5 \+ --max-len-b 2\) \+ 3"):
        ForcedPrefixes(gen, sample, [3, 8, 0])
    # a context that leaves no step at all (already refused), now naming the sentence
    gen = _LimitsGenerator(max_len_b=200, min_len=0, max_len=9)
    with pytest.raises(RuntimeError, match=r"sentence 42 \(batch row 1\): its 8-token target "
                                           r"context leaves no step for the translation"):
        ForcedPrefixes(gen, sample, [3, 8, 0])
    # the boundary: n + min_len == max_len_r for row 1 (8 + 1 == 9) is generated
    gen = _LimitsGenerator(max_len_b=200, min_len=1, max_len=10, beam=1)
    with HostReadCounter() as built:
        forced = ForcedPrefixes(gen, sample, [3, 8, 0])
    # the check is host arithmetic on the prefix lengths: no value read back
    # (counted "cpu": the .to(the batch's device) of the prefixes, a no-op where
    # the batch is, which the counter cannot tell on the CPU)
    assert set(built.by_op) <= {"cpu"}
    steps = []
    with HostReadCounter() as reads, forced:
        for step in range(10):
            steps.append(gen.model.forward_decoder(torch.zeros(3, step + 1, dtype=torch.long))[0])
    assert reads.total == 0
    for step, lprobs in enumerate(steps):
        row = lprobs[1]
        if step < 8:  # the prefix
            assert torch.isfinite(row).sum() == 1 and torch.isfinite(row[4 + step % 8])
        elif step == 8:  # --min-len: no end of sentence yet
            assert not torch.isfinite(row[gen.eos]) and torch.isfinite(row).sum() == 11
        else:  # the last step: only the end of sentence
            assert torch.isfinite(row[gen.eos]) and torch.isfinite(row).sum() == 1
        assert torch.isfinite(lprobs).any(1).all()  # no row without a way on


def test_alignment_of_the_current_sentence(concat_ckpt, toy_bin):
    """--print-alignment (fairseq's generator with alignment, whose model the
    task's one-call forcing wraps too): alignments of the current sentence's
    tokens only."""
    out = generate([toy_bin, "--path", concat_ckpt, *CONCAT22, "--gold-target-context",
                    "--beam", "2", "--max-tokens", "600", "--gen-subset", "test",
                    "--num-workers", "0", "--print-alignment"])
    hyps = _hyps(out)
    aligns = {int(m.group(1)): m.group(2) for m in re.finditer(r"^A-(\d+)\t(.*)$", out, re.M)}
    assert len(hyps) == 48 and aligns.keys() == hyps.keys()
    for i, a in aligns.items():
        targets = [int(p.split("-")[1]) for p in a.split()]
        assert targets and max(targets) <= len(hyps[i].split())  # (+ </s>)


def test_contrastive_scores_the_current_sentence_only(concat_ckpt, toy_bin, toy_corpus):
    """The score is the current sentence's log-probability given the context
    (prefix tokens excluded): computed here from a training batch."""
    from ctx_fairseq.eval.scoring import contrastive as C
    from ctx_fairseq.eval.scoring.suite_report import SuiteOptions

    res, suite, scores = C.evaluate_checkpoint(concat_ckpt, toy_bin,
                                               os.path.join(toy_corpus, "test.contrastive.jsonl"),
                                               SuiteOptions(gold_target_context=True),
                                               return_scores=True)
    model, task, _ = C.load_checkpoint(concat_ckpt, toy_bin)
    task.load_dataset("test")
    ds = task.datasets["test"]
    lines = [ex.corpus_line for ex in suite.examples]
    batch = ds.collater([ds[i] for i in lines])
    with torch.no_grad():
        lp = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True)
    tok = lp.gather(-1, batch["target"].unsqueeze(-1)).squeeze(-1).double()
    tok = tok.masked_fill(batch["target"].eq(task.target_dictionary.pad()), 0)
    want = {}
    for r, (i, p) in enumerate(zip(batch["id"].tolist(), batch["target_prefix_len"].tolist())):
        want[i] = float(tok[r, p:].sum())
        assert p == 0 or abs(float(tok[r].sum()) - want[i]) > 1e-3  # the prefix would count
    np.testing.assert_allclose([s[0] for s in scores], [want[i] for i in lines], atol=1e-4)


def test_context_loss_weight(toy_bin):
    from fairseq import criterions

    from ctx_fairseq.criterions.label_smoothed_cross_entropy_ctx import (
        LabelSmoothedCrossEntropyCtxCriterion,
    )

    task = _task(toy_bin, *CONCAT22, "--concat-context-loss-weight", "0.0", *TINY_MODEL_ARGS,
                 "--criterion", "label_smoothed_cross_entropy_ctx")
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    from fairseq import options

    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_bin, "--arch", "transformer", *TINY_MODEL_ARGS, *CONCAT22,
        "--criterion", "label_smoothed_cross_entropy_ctx", "--label-smoothing", "0.1"])
    model = task.build_model(args).eval()
    crit = LabelSmoothedCrossEntropyCtxCriterion(task, False, 0.1)
    sample = ds.collater([ds[i] for i in range(8)])
    loss0 = crit(model, sample)[0]
    # the weight-0 loss equals the loss over the current sentences alone
    masked = dict(sample)
    tgt = sample["target"].clone()
    cols = torch.arange(tgt.size(1)).unsqueeze(0)
    tgt[cols < sample["target_prefix_len"].unsqueeze(1)] = task.target_dictionary.pad()
    masked["target"] = tgt
    task.cfg.concat_context_loss_weight = 1.0
    loss_masked = crit(model, masked)[0]
    loss_full = crit(model, sample)[0]
    assert float(loss0) == pytest.approx(float(loss_masked), rel=1e-5)
    assert float(loss_full) > float(loss0) + 1e-3
    task.cfg.concat_context_loss_weight = 0.5
    with pytest.raises(ValueError, match="needs --criterion label_smoothed_cross_entropy_ctx"):
        task.build_criterion(options.parse_args_and_arch(options.get_training_parser(), [
            toy_bin, "--arch", "transformer", *CONCAT22, "--criterion", "cross_entropy"]))
    assert criterions  # imported for the registry


def test_context_architectures_are_refused(toy_bin):
    from fairseq import options

    task = _task(toy_bin, *CONCAT)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_bin, "--arch", "transformer_context_aware", *TINY_MODEL_ARGS, *CONCAT])
    with pytest.raises(ValueError, match="for sentence-level architectures"):
        task.build_model(args)


def test_strip_prefix():
    from ctx_fairseq.data.concat_dataset import strip_prefix

    h = {"tokens": torch.tensor([5, 6, 9, 7, 8, 2]), "score": torch.tensor(0.0),
         "positional_scores": torch.tensor([-0.1, -0.2, -0.3, -1.0, -2.0, -3.0]),
         "attention": torch.arange(12.0).view(2, 6), "alignment": None}
    out = strip_prefix([[h]], [3], len_penalty=1.0)[0][0]
    assert out["tokens"].tolist() == [7, 8, 2]
    assert out["positional_scores"].tolist() == [-1.0, -2.0, -3.0]
    assert float(out["score"]) == pytest.approx(-2.0)  # mean over the kept tokens
    assert out["attention"].tolist() == [[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
    assert strip_prefix([[h]], [0])[0][0]["tokens"].tolist() == h["tokens"].tolist()


def test_bench_counts_concatenated_sequences(capsys):
    """ctx-bench builds transformer_concat's batch with the task's dataset: the
    model reads the concatenated sequences (about twice the FLOPs per
    translated token with one context sentence) and decodes the target
    context as a forced prefix."""
    import json

    from ctx_fairseq.cli import bench

    bench.cli_main(["--archs", "transformer_concat", "--layers", "1", "--embed-dim", "16",
                    "--heads", "2", "--ffn-dim", "32", "--vocab", "64", "--src-len", "6",
                    "--tgt-len", "5", "--doc-len", "4", "--max-tokens", "200",
                    "--infer-sentences", "3", "--beam", "2", "--repeats", "1",
                    "--train-steps", "1", "--warmup", "0", "--json"])
    rep = json.loads(capsys.readouterr().out)
    base, cc = rep["results"]
    assert cc["arch"] == "transformer_concat"
    assert cc["params"] >= base["params"]  # the same model (plus the <brk> embedding)
    assert 0.3 < cc["flops_ratio_bound"] < 0.8
    assert 0.3 < cc["infer_flops_ratio_bound"] < 0.9


def test_own_target_context_for_a_context_model(selective_dec_ckpt, toy_bin):
    """--own-target-context is not only for concatenation: a whole-document
    model with target memory translates with its own earlier hypotheses."""
    from conftest import SELECTIVE_DEC_ARGS

    out = generate([toy_bin, "--path", selective_dec_ckpt, *SELECTIVE_DEC_ARGS, "--beam", "1",
                    "--max-tokens", "600", "--gen-subset", "test", "--num-workers", "0",
                    "--own-target-context"])
    assert len(_hyps(out)) == 48


def test_bench_refuses_documents_without_context(capsys):
    from ctx_fairseq.cli import bench

    with pytest.raises((SystemExit, ValueError)):
        bench.cli_main(["--archs", "transformer_concat", "--layers", "1", "--embed-dim", "16",
                        "--heads", "2", "--ffn-dim", "32", "--vocab", "64", "--src-len", "6",
                        "--tgt-len", "5", "--doc-len", "1", "--infer-sentences", "0",
                        "--repeats", "1", "--train-steps", "1", "--warmup", "0"])


def test_strip_prefix_alignment_and_order():
    from ctx_fairseq.data.concat_dataset import strip_prefix

    def hyp(scores, align):
        return {"tokens": torch.arange(len(scores)), "score": torch.tensor(0.0),
                "positional_scores": torch.tensor(scores), "attention": None,
                "alignment": align}

    a = hyp([-0.1, -0.1, -3.0, -3.0], [(0, 0), (1, 1), (2, 2), (3, 3), (4, 3)])
    b = hyp([-5.0, -5.0, -0.5, -0.5], [(0, 2)])
    row = strip_prefix([[a, b]], [2])[0]
    assert [float(h["score"]) for h in row] == [-0.5, -3.0]  # re-sorted after the prefix
    assert row[1]["alignment"] == [(2, 0), (3, 1), (4, 1)]
    assert row[0]["alignment"] == [(0, 0)]
    soft = hyp([-1.0, -1.0, -1.0], [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    assert strip_prefix([[soft]], [1])[0][0]["alignment"] == [[1.0, 0.0], [0.0, 1.0]]


def test_shuffled_context_with_per_sentence_room(toy_bin):
    """--context-ablation shuffled with concatenation: the donor's context is
    cut to the receiver's own room, so every sequence still fits."""
    task = _task(toy_bin, *CONCAT22, "--source-context-size", "3", "--target-context-size", "3",
                 "--max-source-positions", "16", "--max-target-positions", "16",
                 "--context-ablation", "shuffled")
    task.load_dataset("test")
    ds = task.datasets["test"]
    inner = ds.inner
    differs = 0
    for i in range(len(ds)):
        item = ds[i]
        assert len(item["source"]) <= 16 and len(item["target"]) <= 16
        assert ds.size(i) == (len(item["source"]), len(item["target"]))
        if inner.sent_pos[i] > 0 and int(inner.donor[i]) != i:
            differs += 1
    assert differs > 0


def test_own_target_context_refuses_ablation(concat_ckpt, toy_bin):
    with pytest.raises(ValueError, match="--own-target-context with --context-ablation"):
        generate([toy_bin, "--path", concat_ckpt, *CONCAT22, "--beam", "1", "--max-tokens",
                  "600", "--gen-subset", "test", "--num-workers", "0", "--own-target-context",
                  "--context-ablation", "shuffled", "--allow-context-change"])
    with pytest.raises(ValueError, match="--score-reference with --concat-context"):
        generate([toy_bin, "--path", concat_ckpt, *CONCAT22, "--gold-target-context",
                  "--max-tokens", "600", "--gen-subset", "test", "--num-workers", "0",
                  "--score-reference"])


# --------------------------------------------------------------------------- own target context at scale


class _StubEnsemble:
    def forward_decoder(self, *args, **kwargs):
        raise AssertionError("the stub generator does not decode")

    def reorder_incremental_state(self, *args, **kwargs):
        pass


class _StubGenerator:
    """Stands in for fairseq's generator: row ``r`` (sentence ``i``) gets its
    forced prefix (concatenation: the batch's ``target_prefix``, which the
    task forces through the generator's model), then 1-7 words drawn for
    ``i``, then ``</s>``; records the target context each sentence was
    given."""

    beam_size, max_len_a, max_len_b, max_len, min_len = 1, 0, 200, 1024, 1
    token_indices_to_suppress = None

    def __init__(self, d):
        self.d = d
        self.eos = d.eos()
        self.model = _StubEnsemble()
        self.given = {}

    def generate(self, models, sample, prefix_tokens=None, constraints=None, **kw):
        assert prefix_tokens is None
        out = []
        ni = sample["net_input"]
        for r, i in enumerate(sample["id"].tolist()):
            forced = None
            if "target_prefix_len" in sample:
                forced = sample["target_prefix"][r, :int(sample["target_prefix_len"][r])]
                self.given[i] = forced
            elif "tgt_ctx_tokens" in ni:
                row = ni["tgt_ctx_tokens"][r]
                self.given[i] = row[row.ne(self.d.pad())]
            g = torch.Generator().manual_seed(i)
            words = torch.randint(self.d.nspecial, len(self.d), (1 + i % 7,), generator=g)
            parts = [forced] if forced is not None else []
            t = torch.cat(parts + [words, torch.tensor([self.d.eos()])])
            out.append([{"tokens": t, "score": torch.tensor(-1.0), "attention": None,
                         "positional_scores": torch.full((len(t),), -0.5), "alignment": None}])
        return out


def _own_context_setup(n, concat, k=2, positions=12):
    """One document of ``n`` sentences translated with --own-target-context
    (by the stub generator): ``(task, dataset, generator, base, doc_ids)``."""
    from fairseq import options
    from fairseq.data import LanguagePairDataset
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from ctx_fairseq.models.transformer_dc import _dummy_dictionary
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    d = _dummy_dictionary(40)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/dev/null", "--arch", "transformer", "--task", "document_translation",
        *(["--concat-context"] if concat else []), "--source-context-size", str(k),
        "--target-context-size", str(k), "--own-target-context",
        "--max-source-positions", str(positions), "--max-target-positions", str(positions)])
    task = DocumentTranslationTask(convert_namespace_to_omegaconf(args).task, d, d)
    g = torch.Generator().manual_seed(0)
    src = [torch.cat([torch.randint(d.nspecial, len(d), (1 + i % 4,), generator=g),
                      torch.tensor([d.eos()])]) for i in range(n)]
    sizes = np.array([len(s) for s in src])
    base = LanguagePairDataset(src, sizes, d, src, sizes, d, shuffle=False)
    doc_ids = ["doc"] * n
    empty = torch.tensor([d.eos()])
    ds = task.wrap(base, doc_ids, "<document>", [empty] * n, generation=True)
    task.datasets[task.cfg.gen_subset] = ds
    return task, ds, _StubGenerator(d), base, doc_ids


def _translate(task, ds, gen, max_tokens=120):
    """As fairseq-generate: the dataset's batches (documents cut into chunks
    here), each collated, then the task's inference step."""
    hyps = {}
    for b in ds.batch_by_size(ds.ordered_indices(), max_tokens=max_tokens):
        sample = ds.collater([ds[int(i)] for i in b])
        for i, h in zip(sample["id"].tolist(), task.inference_step(gen, [None], sample)):
            hyps[i] = h[0]["tokens"]
    return hyps


@pytest.mark.parametrize("concat", [True, False])
def test_own_target_context_is_each_sentences_context_from_the_translations(concat):
    """A long document cut into several batches, contexts cut to the length
    limit: every sentence was given exactly the target context a dataset built
    from the final translations gives it (concatenation: the forced prefix)."""
    task, ds, gen, base, doc_ids = _own_context_setup(150, concat)
    hyps = _translate(task, ds, gen)
    assert sorted(hyps) == list(range(150))
    ref = task.wrap(base, doc_ids, "<ref>", [hyps[i] for i in range(150)], generation=True)
    cut = 0
    for i in range(150):
        want = ref[i]["target_prefix"] if concat else ref[i]["tgt_ctx"]
        given = gen.given[i]
        assert torch.equal(given, want), i
        cut += (ref.inner if concat else ref).partial["tgt"][i] != 0
    assert ds.truncation == (ref.inner if concat else ref).truncation
    assert cut > 0 or ds.truncation["tgt"][1] > 0  # the limit was exercised


@pytest.mark.parametrize("concat", [True, False])
def test_own_target_context_work_is_linear_in_the_document(concat, monkeypatch):
    """--own-target-context translates a document position by position; the
    task's and the datasets' work per position must not grow with the
    document (it did: every position recomputed every context length, and
    checked all earlier sentences). Measured without timing: Python lines run
    in the task and dataset modules (4x the document: about 4x the lines, not
    16x), and no array of the whole split is recomputed after loading."""
    import ctx_fairseq.data.batching as batching_mod
    import ctx_fairseq.data.concat_dataset as concat_mod
    import ctx_fairseq.data.document_dataset as dd
    import ctx_fairseq.data.windows as windows_mod
    import ctx_fairseq.tasks.document_datasets as datasets_mod
    import ctx_fairseq.tasks.document_generation as dispatch_mod
    import ctx_fairseq.tasks.document_translation as task_mod
    import ctx_fairseq.tasks.generation as generation_mod

    # (the task's and the dataset's modules: the generation helpers and the
    # windows and batching they use live in modules of their own since issue 26;
    # the task's dataset assembly and generation dispatch since issue 35)
    files = {os.path.abspath(m.__file__) for m in (dd, concat_mod, task_mod, generation_mod,
                                                    windows_mod, batching_mod, datasets_mod,
                                                    dispatch_mod)}
    largest = []
    real_cut = dd.truncate_windows

    def cut(unit, window, limit):
        largest.append(len(unit))
        return real_cut(unit, window, limit)

    def lines_run(n):
        task, ds, gen, _, _ = _own_context_setup(n, concat)
        monkeypatch.setattr(dd, "truncate_windows", cut)
        monkeypatch.setattr(dd.DocumentContextDataset, "refresh_context_lengths",
                            lambda self: pytest.fail("a full refresh per position"))
        count = [0]

        def local(frame, event, arg):
            if event == "line":
                count[0] += 1
            return local

        def calls(frame, event, arg):
            return local if os.path.abspath(frame.f_code.co_filename) in files else None

        sys.settrace(calls)
        try:
            _translate(task, ds, gen)
        finally:
            sys.settrace(None)
            monkeypatch.undo()
        return count[0]

    small, large = lines_run(60), lines_run(240)
    assert large < 5 * small, (small, large)
    assert largest and max(largest) <= 2 * 2 + 1  # each update reads a window's sentences only


if __name__ == "__main__":
    # the timing in docs/concatenation.md: python tests/test_concat_context.py 100 400 1600 6400
    import time

    torch.set_num_threads(1)
    for concat in (True, False):  # warm-up
        _translate(*_own_context_setup(20, concat, k=1, positions=1024)[:3], max_tokens=10 ** 9)
    for n in [int(x) for x in sys.argv[1:]]:
        row = []
        for concat in (True, False):
            task, ds, gen, _, _ = _own_context_setup(n, concat, k=1, positions=1024)
            start = time.perf_counter()
            _translate(task, ds, gen, max_tokens=10 ** 9)
            row.append(1000 * (time.perf_counter() - start) / n)
        print(f"{n} sentences: {row[0]:.2f} ms/sentence (concatenation), {row[1]:.2f} "
              "ms/sentence (context model)", flush=True)


def test_a_sentence_checkpoint_without_the_break_is_fine_tuned(sentence_ckpt, toy_bin,
                                                                tmp_path):
    """A stage-1 sentence model whose dictionaries lack <brk> (the task adds
    it): --finetune-from-model extends its rows on load, as for --doc2doc's
    separator (the sizes before the task's symbols were recorded after <brk>
    was added, so the rows were not extended and loading failed)."""
    from fairseq import checkpoint_utils

    rows = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"][
        "encoder.embed_tokens.weight"].shape[0]
    save = str(tmp_path / "ft")
    train([toy_bin, "--arch", "transformer", *TINY_MODEL_ARGS, *CONCAT22,
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "600", "--max-update", "2", "--save-dir", save,
           "--no-epoch-checkpoints", "--finetune-from-model", sentence_ckpt,
           "--num-workers", "0", "--seed", "1", "--no-progress-bar", "--disable-validation"])
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
    assert state["model"]["encoder.embed_tokens.weight"].shape[0] == rows + 1
