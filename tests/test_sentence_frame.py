"""The sentence-count frame of doc2doc generation
(``ctx_fairseq/tasks/sentence_frame.py``): every hypothesis of every beam has
the source's number of sentences, none shorter than the minimum or longer
than ``a * |x_i| + b``, ``</s>`` only after the last; beams reorder the
frame's state; with nothing to constrain the frame changes nothing of
fairseq's search; no read back to the host per step; the task's dispatch and
its errors."""

import math
import time
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator

from ctx_fairseq.errors import InputError
from fairseq_cli_utils import USER_DIR
from ctx_fairseq.tasks.sentence_frame import (
    FrameOptions,
    SentenceFrame,
    always_frames,
    frame_options,
    source_sentence_lengths,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SEP = "<sep>"


def _dictionary(words=24):
    from ctx_fairseq.models.transformer_dc import _dummy_dictionary

    d = _dummy_dictionary(words)
    d.add_symbol(SEP)
    return d


def _segments(d, sentence_lengths, seed=0):
    """A left-padded batch of segments ``x_1 <sep> ... x_n </s>``, one per
    entry of ``sentence_lengths`` (the lengths of its sentences)."""
    g = torch.Generator().manual_seed(seed)
    sep = d.index(SEP)
    rows = []
    for lens in sentence_lengths:
        parts = []
        for i, n in enumerate(lens):
            parts.append(torch.randint(d.nspecial, sep, (n,), generator=g))
            parts.append(torch.tensor([sep if i < len(lens) - 1 else d.eos()]))
        rows.append(torch.cat(parts))
    width = max(len(r) for r in rows)
    src = torch.full((len(rows), width), d.pad(), dtype=torch.long)
    for i, r in enumerate(rows):
        src[i, width - len(r):] = r
    return {"id": torch.arange(len(rows)) + 100, "nsentences": len(rows),
            "net_input": {"src_tokens": src,
                          "src_lengths": torch.tensor([len(r) for r in rows])}}


class _StubEnsemble(EnsembleModel):
    """An ``EnsembleModel`` of no model: log-probabilities a fixed random
    function of the row's source and the hypothesis's tokens so far (so they
    follow reorders), plus ``bias`` on chosen tokens (to make the search want
    ``</s>`` or ``<sep>`` early, or never)."""

    def __init__(self, vocab, bias=None, seed=0, positions=1024):
        super().__init__([torch.nn.Linear(1, 1)])
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(97, vocab, generator=g).log_softmax(-1)
        self.weights = torch.randint(1, 97, (4096,), generator=g)
        self.bias = torch.zeros(vocab) if bias is None else bias
        self.positions = positions

    def max_decoder_positions(self):
        return self.positions

    def forward_encoder(self, net_input):
        src = net_input["src_tokens"]
        return [{"key": [(src * self.weights[:src.size(1)]).sum(1)]}]

    def reorder_encoder_out(self, encoder_outs, new_order):
        return [{"key": [encoder_outs[0]["key"][0].index_select(0, new_order)]}]

    def reorder_incremental_state(self, incremental_states, new_order):
        pass

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature=1.0):
        h = (tokens * self.weights[:tokens.size(1)]).sum(1) + encoder_outs[0]["key"][0]
        return (self.table[h % 97] + self.bias).log_softmax(-1), None


def _check(hypos, sample, d, opts, max_len=None):
    """Every hypothesis: ``n`` sentences, each within ``[m, L_i]``, ``</s>``
    only at the end (returns the number checked)."""
    sep, eos = d.index(SEP), d.eos()
    n, lengths = source_sentence_lengths(sample["net_input"]["src_tokens"], sep, eos, d.pad())
    checked = 0
    for r, row in enumerate(hypos):
        assert row, f"row {r}: no hypothesis"
        for h in row:
            t = h["tokens"].tolist()
            assert t[-1] == eos and eos not in t[:-1], t
            assert math.isfinite(float(h["score"]))
            if max_len is not None:
                assert len(t) - 1 <= max_len
            pieces, cur = [], []
            for x in t[:-1]:
                if x == sep:
                    pieces.append(cur)
                    cur = []
                else:
                    cur.append(x)
            pieces.append(cur)
            assert len(pieces) == int(n[r]), (r, t)
            for i, p in enumerate(pieces):
                cap = max(int(math.floor(opts.max_len_a * int(lengths[r, i]) + opts.max_len_b)),
                          opts.min_sentence_len)
                assert opts.min_sentence_len <= len(p), (r, i, t)
                if max_len is None:
                    assert len(p) <= cap, (r, i, len(p), cap)
            checked += 1
    return checked


SHAPES = [[3], [2, 5, 1], [4, 4], [1, 1, 1, 1, 2], [6, 2, 3]]


@pytest.mark.parametrize("bias_on,value", [(None, 0.0), ("eos", 8.0), ("sep", 8.0),
                                           ("both", -8.0)])
@pytest.mark.parametrize("beam", [1, 4])
def test_every_hypothesis_keeps_the_sentences(bias_on, value, beam):
    """Whatever the model prefers (``</s>`` or ``<sep>`` early, or neither
    ever), every hypothesis of every beam (``--nbest`` = beam) has the
    source's sentences within their lengths; rows of a batch finish at
    different steps (the generator removes them: reorders with a correction)."""
    d = _dictionary()
    opts = FrameOptions(min_sentence_len=2, max_len_a=1.0, max_len_b=2)
    bias = torch.zeros(len(d))
    if bias_on in ("eos", "both"):
        bias[d.eos()] = value
    if bias_on in ("sep", "both"):
        bias[d.index(SEP)] = value
    gen = SequenceGenerator(_StubEnsemble(len(d), bias), d, beam_size=beam)
    sample = _segments(d, SHAPES)
    with SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts):
        hypos = gen.generate(None, sample)
    assert _check(hypos, sample, d, opts) == len(SHAPES) * beam
    assert gen.max_len_b == 200 and "forward_decoder" not in gen.model.__dict__  # restored


def _reached_by_hand(hypos, sample, d, opts):
    """Sentences of the best hypotheses at their ``L_i`` and all sentences,
    counted on Python lists (the source's sentence lengths too)."""
    sep = d.index(SEP)
    reached = total = 0
    for r, row in enumerate(hypos):
        src = [x for x in sample["net_input"]["src_tokens"][r].tolist() if x != d.pad()]
        src_lens = [len(p.split()) for p in " ".join(map(str, src[:-1])).split(str(sep))]
        out = row[0]["tokens"].tolist()[:-1]
        pieces = [len(p.split()) for p in " ".join(map(str, out)).split(str(sep))]
        assert len(pieces) == len(src_lens)
        for n_src, n_out in zip(src_lens, pieces):
            cap = max(int(math.floor(opts.max_len_a * n_src + opts.max_len_b)),
                      opts.min_sentence_len)
            reached += n_out >= cap
            total += 1
    return reached, total


@pytest.mark.parametrize("bias_on, expect", [("never", "all"), ("sep", "none"),
                                             (None, None)])
def test_sentences_at_their_maximum_are_counted(bias_on, expect):
    """``at_maximum``: the best hypotheses' sentences that reached ``L_i``,
    as counted by hand; a model that never ends a sentence has every one
    there, one that ends each as soon as it may (``m`` below every ``L_i``)
    none; no row capped by the positions here; a row without hypotheses is
    left out."""
    d = _dictionary()
    opts = FrameOptions(min_sentence_len=1, max_len_a=1.0, max_len_b=2)
    bias = torch.zeros(len(d))
    if bias_on == "never":
        bias[d.eos()] = bias[d.index(SEP)] = -30.0
    elif bias_on == "sep":
        bias[d.eos()] = bias[d.index(SEP)] = 30.0
    gen = SequenceGenerator(_StubEnsemble(len(d), bias), d, beam_size=3)
    sample = _segments(d, SHAPES)
    with SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts) as frame:
        hypos = gen.generate(None, sample)
    got = frame.at_maximum(hypos).tolist()
    assert got == [*_reached_by_hand(hypos, sample, d, opts), 0]
    total = sum(len(x) for x in SHAPES)
    assert got[1] == total
    if expect == "all":
        assert got[0] == total
    elif expect == "none":
        assert got[0] == 0
    without = frame.at_maximum([hypos[0], [], *hypos[2:]]).tolist()
    assert without[1] == total - len(SHAPES[1])


def test_the_task_warns_with_the_counts(caplog):
    """The task's warnings: the sentences at their maximum as counted by hand
    on the hypotheses it returned, with a running total; with the model's
    positions below the frame's sum, the segments that reached them."""
    d = _dictionary()
    model = _tiny_transformer(d)
    sample = _segments(d, SHAPES)
    opts = FrameOptions(min_sentence_len=1, max_len_a=0.5, max_len_b=1)
    task = _task(_cfg(doc2doc_frame=True, doc2doc_max_len_a=0.5, doc2doc_max_len_b=1), d)
    # (the stub's log-probabilities, ends favoured a little: sentences end at various lengths)
    ends = torch.zeros(len(d))
    ends[d.eos()] = ends[d.index(SEP)] = 2.0
    gen = SequenceGenerator(_StubEnsemble(len(d), ends, seed=3), d, beam_size=2)
    with caplog.at_level("WARNING"):
        hypos = task.inference_step(gen, [model], sample)
        task.inference_step(gen, [model], sample)
    reached, total = _reached_by_hand(hypos, sample, d, opts)
    assert 0 < reached < total, (reached, total)  # a mix: the count is informative
    msgs = [r.getMessage() for r in caplog.records if "reached their maximum" in r.getMessage()]
    assert len(msgs) == 2 and f"{reached} of {total} sentences of this batch" in msgs[0], msgs
    assert f"({2 * reached} of {2 * total} so far)" in msgs[1], msgs
    assert "--doc2doc-min-sentence-len 1" in msgs[0]
    # positions below the frame's sum: a model that never ends a sentence fills them
    bias = torch.zeros(len(d))
    bias[d.eos()] = bias[d.index(SEP)] = -30.0
    stub = SequenceGenerator(_StubEnsemble(len(d), bias, positions=9), d, beam_size=2)
    caplog.clear()
    with caplog.at_level("WARNING"):
        task.inference_step(stub, [model], _segments(d, [[6, 2, 3], [4, 4]]))
    capped = [r.getMessage() for r in caplog.records
              if "segments of this batch" in r.getMessage()]
    assert len(capped) == 1 and "1 of 2 segments" in capped[0], caplog.text
    assert "maximum target positions (8 output tokens)" in capped[0]


def test_model_positions_cap_the_output_and_counts_still_hold():
    """The model's maximum target positions below the frame's sum: every
    hypothesis still has its ``n`` sentences (they end before their own
    maximum), within the cap; a segment whose ``n`` sentences of ``m`` tokens
    cannot fit is refused, naming it."""
    d = _dictionary()
    opts = FrameOptions(min_sentence_len=1, max_len_a=2.0, max_len_b=5)
    bias = torch.zeros(len(d))
    bias[d.eos()] = bias[d.index(SEP)] = -8.0  # the model never wants to stop
    gen = SequenceGenerator(_StubEnsemble(len(d), bias, positions=14), d, beam_size=3)
    sample = _segments(d, [[3, 3, 3], [1, 2], [2, 2, 2, 2]])
    with SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts) as frame:
        assert frame.max_len == 13
        hypos = gen.generate(None, sample)
    assert _check(hypos, sample, d, opts, max_len=13) == 9
    sample = _segments(d, [[1], [1] * 8])  # 8 sentences need 15 tokens, 13 fit
    with pytest.raises(InputError, match=r"segment 101 \(batch row 1\): its 8 sentences need at "
                                         r"least 15 target tokens.*allow 13"):
        SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts)


def _tiny_transformer(d, arch="transformer"):
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_cli_utils import TINY_MODEL_ARGS, DictionaryTask

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/dev/null", "--user-dir", USER_DIR, "--arch", arch, "--task", "translation",
        "--dropout", "0", *TINY_MODEL_ARGS])
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, DictionaryTask(d)).eval()


@pytest.mark.parametrize("arch", ["transformer", "transformer_gtrans"])
def test_real_transformer_beam_with_reorders(arch):
    """A random tiny transformer or G-Transformer (incremental state
    reordered by fairseq as usual), beam 3, nbest 3: every hypothesis keeps
    the sentences."""
    d = _dictionary()
    model = _tiny_transformer(d, arch)
    opts = FrameOptions(min_sentence_len=1, max_len_a=1.5, max_len_b=3)
    gen = SequenceGenerator([model], d, beam_size=3)
    sample = _segments(d, SHAPES, seed=3)
    with SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts):
        hypos = gen.generate([model], sample)
    assert _check(hypos, sample, d, opts) == len(SHAPES) * 3


def test_with_nothing_to_constrain_the_search_is_fairseqs():
    """One-sentence segments, ``a = 0``: the frame's only constraints are
    fairseq's own (``<sep>`` suppressed, at most ``b`` tokens, ``</s>`` not
    first), so the hypotheses (tokens, scores) are those of fairseq's
    generator with ``--max-len-a 0 --max-len-b b`` and ``<sep>`` suppressed:
    the wrapper disturbs nothing else."""
    d = _dictionary()
    model = _tiny_transformer(d)
    sample = _segments(d, [[5], [3], [7], [2]], seed=5)
    plain = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=6,
                              tokens_to_suppress=[SEP])
    ref = plain.generate([model], sample)
    gen = SequenceGenerator([model], d, beam_size=4)
    opts = FrameOptions(min_sentence_len=1, max_len_a=0.0, max_len_b=6)
    with SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts):
        ours = gen.generate([model], sample)
    for a, b in zip(ours, ref):
        assert len(a) == len(b) == 4
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"])
            assert torch.allclose(x["positional_scores"], y["positional_scores"])
            assert float(x["score"]) == pytest.approx(float(y["score"]))


def test_no_read_back_per_step():
    """The frame reads two numbers back once per call (the batch's limits)
    and nothing per step (counted with the project's counter)."""
    from ctx_fairseq.host_reads import HostReadCounter

    d = _dictionary()
    gen = SequenceGenerator(_StubEnsemble(len(d)), d, beam_size=2)
    sample = _segments(d, SHAPES)
    opts = FrameOptions()
    with HostReadCounter() as built:
        frame = SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts)
    assert built.total == 1, built.by_op
    hyps = len(SHAPES) * 2
    tokens = torch.full((hyps, 1), d.eos())
    with frame, HostReadCounter() as steps:
        for t in range(6):
            lprobs = torch.randn(hyps, len(d)).log_softmax(-1)
            frame.constrain(tokens, lprobs)
            order = torch.randperm(hyps)
            gen.model.reorder_incremental_state([{}], order)  # (the frame's, wrapping the stub's)
            tokens = torch.cat([tokens[order], torch.randint(4, len(d), (hyps, 1))], 1)
    assert steps.total == 0, steps.by_op


def test_source_sentence_lengths_left_padded():
    d = _dictionary()
    sample = _segments(d, [[3, 1, 2], [4], [0, 2]])
    n, lengths = source_sentence_lengths(sample["net_input"]["src_tokens"], d.index(SEP),
                                         d.eos(), d.pad())
    assert n.tolist() == [3, 1, 2]
    assert lengths[:, :3].tolist() == [[3, 1, 2], [4, 0, 0], [0, 2, 0]]


# ------------------------------------------------------------------- the task
def _cfg(**kw):
    base = dict(doc2doc="greedy", doc2doc_separator=SEP, doc2doc_frame=False,
                doc2doc_min_sentence_len=1, doc2doc_max_len_a=1.5, doc2doc_max_len_b=10)
    base.update(kw)
    return SimpleNamespace(**base)


def test_frame_options_when_used():
    gtrans = SimpleNamespace(always_frame=True)
    plain = SimpleNamespace()
    assert frame_options(_cfg(), [plain]) is None
    assert frame_options(_cfg(doc2doc_frame=True), [plain]) == FrameOptions()
    assert frame_options(_cfg(doc2doc_min_sentence_len=2), [gtrans]).min_sentence_len == 2
    assert frame_options(_cfg(doc2doc="none"), [gtrans]) is None
    assert frame_options(SimpleNamespace(), [plain]) is None  # options not declared
    with pytest.raises(InputError, match="--doc2doc-frame .* needs --doc2doc greedy"):
        frame_options(_cfg(doc2doc="none", doc2doc_frame=True), [plain])
    with pytest.raises(InputError, match="at least 1 token"):
        frame_options(_cfg(doc2doc_frame=True, doc2doc_min_sentence_len=0), [plain])


def _task(cfg, d):
    from fairseq.tasks.translation import TranslationTask

    from ctx_fairseq.tasks.document_generation import DocumentGenerationMixin

    class Task(DocumentGenerationMixin, TranslationTask):
        uses_context = False

        def __init__(self):  # (no data: only what generation reads)
            self.cfg, self.src_dict, self.tgt_dict = cfg, d, d

    return Task()


def test_task_dispatch_frame_on_and_off():
    """``inference_step``: with ``--doc2doc-frame`` (or a model that always
    frames) every hypothesis keeps the sentences; without, fairseq's
    generator runs unwrapped (the same output as calling it directly)."""
    d = _dictionary()
    model = _tiny_transformer(d)
    sample = _segments(d, SHAPES, seed=7)
    gen = SequenceGenerator([model], d, beam_size=2)
    off = _task(_cfg(), d).inference_step(gen, [model], sample)
    direct = gen.generate([model], sample)
    for a, b in zip(off, direct):
        assert all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))
    cfg = _cfg(doc2doc_frame=True, doc2doc_max_len_a=1.0, doc2doc_max_len_b=2)
    on = _task(cfg, d).inference_step(gen, [model], sample)
    opts = frame_options(cfg, [model])
    assert _check(on, sample, d, opts) == len(SHAPES) * 2
    model.always_frame = True  # (transformer_gtrans's class attribute)
    again = _task(_cfg(doc2doc_max_len_a=1.0, doc2doc_max_len_b=2), d).inference_step(
        gen, [model], sample)
    assert [[h["tokens"].tolist() for h in r] for r in again] == \
        [[h["tokens"].tolist() for h in r] for r in on]


def test_transformer_gtrans_always_frames():
    """G-Transformer decodes with the frame without ``--doc2doc-frame``; a
    plain transformer does not."""
    d = _dictionary()
    gtrans = _tiny_transformer(d, "transformer_gtrans")
    assert always_frames(gtrans) and not always_frames(_tiny_transformer(d))
    assert frame_options(_cfg(), [gtrans]) == FrameOptions()


def test_task_errors():
    d = _dictionary()
    task = _task(_cfg(doc2doc_frame=True), d)
    with pytest.raises(InputError, match="fairseq-interactive with --doc2doc is not supported"):
        task.build_dataset_for_inference([torch.tensor([5, 2])], [2])
    model = _tiny_transformer(d)
    for flag, msg in ((dict(min_len=2), "--min-len 2 cannot"),
                      (dict(match_source_len=True), "--match-source-len cannot"),
                      (dict(prefix_size=1), "--prefix-size cannot"),
                      (dict(no_repeat_ngram_size=3), "--no-repeat-ngram-size cannot")):
        with pytest.raises(InputError, match=msg):
            task.build_generator([model], Namespace(**flag))
    no_sep = _dictionary()
    no_sep.symbols[no_sep.index(SEP)] = "<other>"
    no_sep.indices = {s: i for i, s in enumerate(no_sep.symbols)}
    with pytest.raises(InputError, match="separator '<sep>' is not in the source dictionary"):
        _task(_cfg(doc2doc_frame=True), no_sep).build_generator([model], Namespace())
    # a segment whose sentences cannot fit the model's positions, named with its document
    task.datasets = {"test": SimpleNamespace(
        plan=SimpleNamespace(doc=[0, 1]), doc_names=["talk1", "talk2"], docids_path="t.docids",
        sentence_ids=lambda i: [7, 8, 9, 10, 11, 12, 13, 14])}
    gen = SequenceGenerator([model], d, max_len=14)
    with pytest.raises(InputError, match=r"segment 1 \(test: document 'talk2' of t.docids, "
                                         r"sentences 7-14, batch row 1\): its 8 sentences"):
        task.inference_step(gen, [model], dict(_segments(d, [[1], [1] * 8]),
                                               id=torch.tensor([0, 1])))
    gen = SequenceGenerator([model], d, min_len=3)  # (built past the task's checks)
    with pytest.raises(InputError, match="--min-len 3 cannot"):
        task.inference_step(gen, [model], _segments(d, [[2]]))


@pytest.mark.slow
def test_decoding_speed_with_and_without_frame(record_property):
    """Decoding speed, tiny transformer on the CPU (vocabulary 201, beam 5,
    16 segments of 4 sentences, the same maximum length): the best of 5
    interleaved runs with and without the frame, and the share of the
    frame's own work (``constrain``, timed inside the framed run; the
    figure that the load of a shared machine disturbs least)."""
    d = _dictionary(200)
    model = _tiny_transformer(d)
    shape = [8, 12, 6, 10]
    sample = _segments(d, [shape] * 16, seed=9)
    opts = FrameOptions(max_len_a=1.5, max_len_b=10)
    b = sum(int(1.5 * x + 10) for x in shape) + len(shape) - 1
    best, share = {"plain": math.inf, "frame": math.inf}, math.inf
    for _ in range(5):
        for name in best:
            gen = SequenceGenerator([model], d, beam_size=5, max_len_a=0, max_len_b=b)
            t0 = time.perf_counter()
            if name == "frame":
                frame, inside = SentenceFrame(gen, sample, d.index(SEP), d.index(SEP), opts), []
                real = frame.constrain

                def timed(*a):
                    t1 = time.perf_counter()
                    out = real(*a)
                    inside.append(time.perf_counter() - t1)
                    return out

                frame.constrain = timed
                with frame:
                    gen.generate([model], sample)
            else:
                gen.generate([model], sample)
            took = time.perf_counter() - t0
            best[name] = min(best[name], took)
            if name == "frame":
                share = min(share, sum(inside) / took)
    for name, t in best.items():
        record_property(f"{name}_seconds", round(t, 3))
        print(f"{name}: {t:.3f} s")
    record_property("frame_share", round(share, 3))
    print(f"the frame's own work: {100 * share:.1f}% of the framed run")
    assert share <= 0.25


def test_fairseq_generate_with_the_frame(toy_bin, tmp_path):
    """fairseq-generate on doc2doc segments of the toy corpus, a briefly
    trained tiny transformer, ``--doc2doc-frame``, beam 3 and ``--nbest 3``:
    every hypothesis printed has as many separators as its source."""
    from fairseq_cli_utils import USER_DIR, train_and_generate

    task = ["--user-dir", USER_DIR, "--task", "document_translation", "--source-context-size",
            "0", "--doc2doc", "greedy", "--doc2doc-max-tokens", "48"]
    out = train_and_generate(toy_bin, str(tmp_path / "ck"), "transformer", extra=task,
                             max_update=2, gen_extra=[*task, "--doc2doc-frame", "--beam", "3",
                                                      "--nbest", "3"])
    lines = [line.split("\t") for line in out.splitlines()]
    src = {f[0][2:]: f[1] for f in lines if f[0].startswith("S-")}
    hyps = [(f[0][2:], f[2]) for f in lines if f[0].startswith("H-")]
    assert len(hyps) == 3 * len(src) and any("<sep>" in s for s in src.values())
    for i, h in hyps:
        assert h.count("<sep>") == src[i].count("<sep>"), (src[i], h)
