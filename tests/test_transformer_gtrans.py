"""transformer_gtrans (G-Transformer, Bao et al. 2021; issue 39): group tags,
group attention, the gate, incremental decoding with beams, word dropout and
loading a sentence-level transformer. Tiny models, float64 where exactness is
checked."""

import argparse

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_cli_utils import TINY_MODEL_ARGS, decode_with_reorder

import ctx_fairseq  # noqa: F401  (registers the plugin)
from ctx_fairseq.errors import InputError
from ctx_fairseq.modules.group_attention import (
    cross_group_mask,
    self_group_mask,
    source_group_tags,
    target_group_tags,
    word_dropout,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SEP = "<sep>"


def _dict(vocab=30, sep=True):
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    if sep:
        d.add_symbol(SEP)
    return d


class _Dicts:
    """What build_model reads of a task: the dictionaries (no options)."""

    def __init__(self, d):
        self.source_dictionary = self.target_dictionary = d


def _args(arch, *extra):
    return options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", arch, "--task", "translation", "--dropout", "0",
         *TINY_MODEL_ARGS, *extra])


def _build(arch="transformer_gtrans", extra=(), d=None, seed=0, double=True):
    d = d or _dict()
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(_args(arch, *extra), _Dicts(d))
    with torch.no_grad():  # non-trivial biases and LayerNorms
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    if double:
        model = model.double()
    return model.eval(), d


def _segments(d, sentences, seed, left_pad=True, extra_pad=0):
    """A batch of segments: row r is ``x_1 <sep> ... x_n </s>`` with sentence
    lengths ``sentences[r]`` (random words), padded (left for sources)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for lens in sentences:
        parts = []
        for i, n in enumerate(lens):
            parts.append(torch.randint(d.nspecial, d.index(SEP), (n,), generator=g))
            parts.append(torch.tensor([d.index(SEP) if i < len(lens) - 1 else d.eos()]))
        rows.append(torch.cat(parts))
    width = max(len(r) for r in rows) + extra_pad
    out = torch.full((len(rows), width), d.pad(), dtype=torch.long)
    for i, r in enumerate(rows):
        if left_pad:
            out[i, width - len(r):] = r
        else:
            out[i, :len(r)] = r
    return out


def _prev(target, d):
    """fairseq's shift of a right-padded target: ``</s> y_1 ... `` ."""
    prev = torch.full_like(target, d.pad())
    prev[:, 0] = d.eos()
    prev[:, 1:] = target[:, :-1]
    return prev.masked_fill(target.eq(d.pad()), d.pad())


# ------------------------------------------------------------------ tags and masks


def test_group_tags_follow_the_contract():
    sep, pad, eos = 9, 1, 2
    src = torch.tensor([[pad, 5, 6, sep, 7, sep, 8, eos]])
    assert source_group_tags(src, sep, pad).tolist() == [[-1, 0, 0, 0, 1, 1, 2, 2]]
    prev = torch.tensor([[eos, 5, sep, 7, 8, sep, 6, pad]])
    assert target_group_tags(prev, sep, pad).tolist() == [[0, 0, 1, 1, 1, 2, 2, -1]]


def test_masks_never_leave_a_row_empty():
    tags = torch.tensor([[-1, -1, 0, 0, 1]])
    m = self_group_mask(tags, causal=True)
    assert m.any(-1).all() and m.diagonal(dim1=1, dim2=2).all()
    # target group 2 has no source group: every real source token; an all-pad source: every key
    q = torch.tensor([[0, 1, 2], [0, 0, 1]])
    k = torch.tensor([[0, 0, 1, 1], [-1, -1, -1, -1]])
    m = cross_group_mask(q, k)
    assert m[0].tolist() == [[True, True, False, False], [False, False, True, True],
                             [True, True, True, True]]
    assert m[1].all()


def test_word_dropout_spares_specials_and_the_separator():
    d = _dict()
    tokens = _segments(d, [[20, 20, 20]] * 4, seed=0)
    torch.manual_seed(3)
    out = word_dropout(tokens, 0.5, d.unk(), d.nspecial, d.index(SEP))
    special = tokens.lt(d.nspecial) | tokens.eq(d.index(SEP))
    assert torch.equal(out[special], tokens[special])
    dropped = out.ne(tokens)
    assert dropped.any() and out[dropped].eq(d.unk()).all()
    assert 0.3 < dropped.sum().item() / (~special).sum().item() < 0.7
    torch.manual_seed(3)
    assert torch.equal(word_dropout(tokens, 0.5, d.unk(), d.nspecial, d.index(SEP)), out)


def test_word_dropout_only_in_training():
    model, d = _build(extra=["--word-dropout", "0.9"])
    src = _segments(d, [[6, 5]], seed=1)
    prev = _prev(_segments(d, [[5, 4]], seed=2, left_pad=False), d)
    lengths = src.ne(d.pad()).sum(1)
    out1, _ = model(src, lengths, prev)
    out2, _ = model(src, lengths, prev)
    assert torch.equal(out1, out2)
    model.train()
    torch.manual_seed(0)
    out3, _ = model(src, lengths, prev)
    assert not torch.allclose(out1, out3)


# ------------------------------------------------------------------ equivalences


def test_without_global_layers_one_sentence_segments_equal_the_transformer():
    """--gtrans-global-layers 0 on one-sentence segments (no separator): the
    transformer's outputs with its weights."""
    model, d = _build(extra=["--gtrans-global-layers", "0"])
    tf, _ = _build(arch="transformer", d=d, seed=5)
    model.load_state_dict(tf.state_dict())
    assert model.new_parameter_names() == set()
    src = _segments(d, [[7], [4], [9]], seed=3)
    tgt = _segments(d, [[5], [8], [3]], seed=4, left_pad=False)
    prev = _prev(tgt, d)
    lengths = src.ne(d.pad()).sum(1)
    real = tgt.ne(d.pad())
    # alignment_layer -1: no layer returns attention weights (fairseq's softmax of the
    # weights is float32 whatever the input's dtype)
    ours, _ = model(src, lengths, prev, alignment_layer=-1)
    theirs, _ = tf(src, lengths, prev, alignment_layer=-1)
    assert torch.allclose(ours[real], theirs[real], atol=1e-10)
    ours, ours_extra = model(src, lengths, prev)
    theirs, theirs_extra = tf(src, lengths, prev)
    assert torch.allclose(ours[real], theirs[real], atol=1e-6)
    assert torch.allclose(ours_extra["attn"][0][real], theirs_extra["attn"][0][real], atol=1e-6)


def test_a_sentence_checkpoint_loads_and_the_new_parameters_stay():
    model, d = _build()
    tf, _ = _build(arch="transformer", d=d, seed=5)
    new = model.new_parameter_names()
    # top 2 of 2 layers: encoder self, decoder self and cross; global attention + gate each
    assert len(new) == 3 * 2 * (8 + 2) and all(".global_attn." in n or ".gate." in n
                                               for n in new)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in new}
    model.load_state_dict(tf.state_dict())
    theirs = tf.state_dict()
    for name, value in model.state_dict().items():
        if name in new:
            assert torch.equal(value, before[name]), name
        else:
            assert torch.equal(value, theirs[name]), name
    with pytest.raises(RuntimeError, match="Unexpected key"):
        bad = dict(tf.state_dict(), **{"encoder.extra": torch.zeros(1)})
        model.load_state_dict(bad)
    with pytest.raises(RuntimeError, match="Missing key"):
        bad = {k: v for k, v in tf.state_dict().items() if "fc1" not in k}
        model.load_state_dict(bad)


def test_padding_invariance():
    """A left-padded source with extra padding (and a right-padded target with
    extra padding) gives the same outputs at the real positions."""
    model, d = _build()
    src = _segments(d, [[3, 4, 2], [5, 1]], seed=6)
    tgt = _segments(d, [[2, 5, 3], [4, 2]], seed=7, left_pad=False)
    prev = _prev(tgt, d)
    out, _ = model(src, src.ne(d.pad()).sum(1), prev)
    pad = 4
    src2 = torch.cat([torch.full((2, pad), d.pad()), src], 1)
    prev2 = torch.cat([prev, torch.full((2, pad), d.pad())], 1)
    out2, _ = model(src2, src2.ne(d.pad()).sum(1), prev2)
    real = tgt.ne(d.pad())
    assert torch.allclose(out[real], out2[:, :tgt.size(1)][real], atol=1e-10)
    enc = model.encoder(src, src.ne(d.pad()).sum(1))["encoder_out"][0]
    enc2 = model.encoder(src2, src2.ne(d.pad()).sum(1))["encoder_out"][0][pad:]
    real_src = src.ne(d.pad()).t()
    assert torch.allclose(enc[real_src], enc2[real_src], atol=1e-10)


@pytest.mark.parametrize("global_layers", ["0", "2"])
def test_incremental_decoding_with_beam_reorder_equals_the_full_forward(global_layers):
    model, d = _build(extra=["--gtrans-global-layers", global_layers])
    src = _segments(d, [[3, 4, 2], [5, 2, 2]], seed=8)
    tgt = _segments(d, [[2, 3, 3], [3, 2, 4]], seed=9, left_pad=False)
    beam = 3
    src = src.repeat_interleave(beam, 0)
    prev = _prev(tgt, d).repeat_interleave(beam, 0)
    # hypotheses of the same sentence differ: shuffle their target words
    g = torch.Generator().manual_seed(1)
    words = prev.ge(d.nspecial) & prev.ne(d.index(SEP))
    prev = torch.where(words, torch.randint(d.nspecial, d.index(SEP), prev.shape, generator=g),
                       prev)
    enc = model.encoder(src, src.ne(d.pad()).sum(1))
    order = torch.tensor([2, 0, 0, 4, 5, 3])  # within each sentence's beam, as beam search
    split = 5
    with torch.no_grad():
        steps, prev2, enc2 = decode_with_reorder(model, enc, prev, split, order)
        full1, _ = model.decoder(prev, enc)
        full2, _ = model.decoder(prev2, enc2)
    real1, real2 = prev.ne(d.pad()), prev2.ne(d.pad())
    real1[:, split:] = False
    real2[:, :split] = False
    assert (steps - full1)[real1].abs().max() < 1e-10  # before the reorder
    assert (steps - full2)[real2].abs().max() < 1e-10  # after it
    # the reorder mattered: without it, the steps after the split would differ
    assert (full1 - full2)[real2].abs().max() > 1e-3


def _grad_of_group(model, d, global_layers: bool):
    """Gradient of the first source sentence's outputs of the encoder (local
    layers only, or the whole encoder) w.r.t. the embeddings of the second."""
    src = _segments(d, [[4, 5]], seed=10)
    sep_pos = src[0].tolist().index(d.index(SEP))
    emb = model.encoder.embed_tokens
    x = model.encoder.embed_scale * emb(src)
    x = x + model.encoder.embed_positions(src)
    x = x.detach().requires_grad_(True)
    h = x.transpose(0, 1)
    tags = source_group_tags(src, model.encoder.separator, d.pad())
    from ctx_fairseq.modules.group_attention import attached_masks

    layers = model.encoder.layers if global_layers else model.encoder.layers[:1]
    mask = self_group_mask(tags, causal=False)
    with attached_masks((layer.self_attn, mask) for layer in model.encoder.layers):
        for layer in layers:
            h = layer(h, encoder_padding_mask=src.eq(d.pad()))
    h[: sep_pos + 1].sum().backward()
    return x.grad[0, sep_pos + 1:]


def test_groups_do_not_see_each_other_in_local_layers_only():
    model, d = _build(extra=["--gtrans-global-layers", "1"])
    assert _grad_of_group(model, d, global_layers=False).abs().max() == 0
    assert _grad_of_group(model, d, global_layers=True).abs().max() > 0


def test_decoder_groups_are_local_without_global_layers():
    """Changing the 2nd source sentence changes nothing of the 1st target
    sentence's outputs (no global layers), and does with them."""
    for layers, same in (("0", True), ("2", False)):
        model, d = _build(extra=["--gtrans-global-layers", layers])
        src = _segments(d, [[4, 5]], seed=11)
        src2 = src.clone()
        sep_pos = src[0].tolist().index(d.index(SEP))
        src2[0, sep_pos + 1:-1] = torch.randint(d.nspecial, d.index(SEP), (5,))
        tgt = _segments(d, [[3, 3]], seed=12, left_pad=False)
        prev = _prev(tgt, d)
        first = target_group_tags(prev, d.index(SEP), d.pad()).eq(0)
        lengths = src.ne(d.pad()).sum(1)
        a, _ = model(src, lengths, prev)
        b, _ = model(src2, lengths, prev)
        assert torch.allclose(a[first], b[first], atol=1e-12) == same


# ------------------------------------------------------------------ precision, errors


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_training_step_in_half_precision_is_finite(dtype):
    model, d = _build(double=False, extra=["--word-dropout", "0.1"])
    src = _segments(d, [[3, 4, 2], [5, 1]], seed=6)
    tgt = _segments(d, [[2, 5, 3], [4, 2]], seed=7, left_pad=False)
    model.train()
    if dtype == torch.float16:
        model = model.half()
        out, _ = model(src, src.ne(d.pad()).sum(1), _prev(tgt, d))
    else:
        with torch.autocast("cpu", dtype=dtype):
            out, _ = model(src, src.ne(d.pad()).sum(1), _prev(tgt, d))
    loss = torch.nn.functional.cross_entropy(out.float().flatten(0, 1), tgt.flatten(),
                                             ignore_index=d.pad())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_building_without_a_separator_or_a_doc2doc_task_is_an_input_error():
    with pytest.raises(InputError, match="'<sep>' is not in the source dictionary"):
        _build(d=_dict(sep=False))
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    d = _dict()
    with pytest.raises(InputError, match="--doc2doc greedy|multires"):
        ARCH_MODEL_REGISTRY["transformer_gtrans"].build_model(
            _args("transformer_gtrans"), TranslationTask(TranslationConfig(), d, d))
    with pytest.raises(InputError, match="--gtrans-global-layers 3"):
        _build(extra=["--gtrans-global-layers", "3"])
    with pytest.raises(InputError, match="--cross-self-attention is not supported"):
        _build(extra=["--cross-self-attention"])
    with pytest.raises(InputError, match="--word-dropout 1.0"):
        _build(extra=["--word-dropout", "1.0"])


def test_the_options_are_declared():
    args = _args("transformer_gtrans_tiny")
    assert args.gtrans_global_layers == 2 and args.word_dropout == 0.0
    assert isinstance(args, argparse.Namespace) and args.encoder_layers == 2


# ------------------------------------------------------------------ through the doc2doc task


def _doc2doc_task(*argv, d=None):
    """``(task, cfg)``: ``--task document_translation`` over dictionary ``d``
    (without ``<sep>``: the task adds it), as fairseq-train builds it."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/dev/null", "--task", "document_translation", "--arch", "transformer_gtrans_tiny",
        "--source-context-size", "0", "--dropout", "0", "--share-all-embeddings", *argv,
        *TINY_MODEL_ARGS])
    cfg = convert_namespace_to_omegaconf(args)
    d = d or _dict(sep=False)
    return DocumentTranslationTask(cfg.task, d, d), cfg


def test_the_doc2doc_task_gives_the_separator_and_doc2doc_none_is_refused():
    task, cfg = _doc2doc_task("--doc2doc", "greedy")
    model = task.build_model(cfg.model)
    sep = task.source_dictionary.index(SEP)
    assert sep != task.source_dictionary.unk()
    assert model.encoder.separator == model.decoder.separator == sep
    assert task.context_spec.doc2doc_separator_index == sep
    task, cfg = _doc2doc_task()
    with pytest.raises(InputError, match="expected --task document_translation --doc2doc"):
        task.build_model(cfg.model)


def test_a_sentence_transformer_of_the_smaller_dictionary_fine_tunes_into_it():
    """The stage-1 transformer's state (its dictionary without <sep>), loaded as
    --finetune-from-model loads it: the task's pre-hook appends the separator's
    rows, the global attentions and gates keep their initialisation, every
    other tensor is the transformer's."""
    d0 = _dict(sep=False)
    tf, _ = _build(arch="transformer", d=d0, extra=["--share-all-embeddings"], double=False)
    task, cfg = _doc2doc_task("--doc2doc", "greedy", d=_dict(sep=False))
    model = task.build_model(cfg.model)
    new = model.new_parameter_names()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.load_state_dict(tf.state_dict(), strict=True, model_cfg=cfg.model)
    theirs = tf.state_dict()
    rows = len(d0)
    for name, value in model.state_dict().items():
        if name in new:
            assert torch.equal(value, before[name]), name
        elif value.dim() == 2 and value.size(0) == rows + 1:  # the embeddings
            assert torch.equal(value[:rows], theirs[name]), name
        else:
            assert torch.equal(value, theirs[name]), name


def test_beam_search_scores_are_those_of_the_full_forward():
    """fairseq's SequenceGenerator (beam 3, incremental, with its reorders):
    each hypothesis's positional scores equal the full forward's on it."""
    from fairseq.sequence_generator import SequenceGenerator

    model, d = _build()
    src = _segments(d, [[3, 4, 2], [5, 2]], seed=13)
    gen = SequenceGenerator([model], d, beam_size=3, max_len_a=0, max_len_b=14)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}
    with torch.no_grad():
        hypos = gen.forward(sample)
        for i, beams in enumerate(hypos):
            for h in beams:
                tgt = h["tokens"].unsqueeze(0)
                prev = torch.cat([tgt.new_full((1, 1), d.eos()), tgt[:, :-1]], 1)
                out = model(src[i:i + 1], sample["net_input"]["src_lengths"][i:i + 1], prev)
                lprobs = model.get_normalized_probs(out, log_probs=True)
                scores = lprobs.gather(-1, tgt.unsqueeze(-1)).view(-1)
                assert torch.allclose(scores, h["positional_scores"], atol=1e-8)


def test_fine_tuned_from_the_sentence_transformer_trains_and_generates_with_the_frame(
        toy_bin, sentence_ckpt, tmp_path):
    """fairseq-train from the stage-1 transformer (--finetune-from-model: its
    dictionary has no <sep>) on greedy segments, then fairseq-generate: one
    hypothesis per segment, each with the source's number of sentences."""
    import os

    from fairseq_cli_utils import generate, train

    task = ["--task", "document_translation", "--doc2doc", "greedy", "--source-context-size",
            "0", "--doc2doc-max-tokens", "64"]
    save = str(tmp_path / "ckpt")
    train([toy_bin, "--arch", "transformer_gtrans", *TINY_MODEL_ARGS, "--share-all-embeddings",
           *task, "--finetune-from-model", sentence_ckpt, "--word-dropout", "0.1",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    out = generate([toy_bin, "--path", os.path.join(save, "checkpoint_last.pt"), *task,
                    "--doc2doc-frame", "--gen-subset", "test", "--beam", "2",
                    "--max-tokens", "500", "--num-workers", "0"])
    srcs = [line.split("\t")[1] for line in out.splitlines() if line.startswith("S-")]
    hyps = [line.split("\t")[2] for line in out.splitlines() if line.startswith("H-")]
    assert 0 < len(hyps) == len(srcs) and any(SEP in s for s in srcs)
    assert [h.count(SEP) for h in hyps] == [s.count(SEP) for s in srcs]


def test_lr_scale_pretrained_sees_the_global_attentions_and_gates_as_new():
    from ctx_fairseq.optim.lr_scale import pretrained_mask

    model, _ = _build()
    params = list(model.parameters())
    new = {id(p) for n, p in model.named_parameters() if n in model.new_parameter_names()}
    assert new and [not m for m in pretrained_mask(model, params)] == [id(p) in new
                                                                      for p in params]


def test_layerdrop_trains():
    """fairseq's LayerDropModuleList drops layers at random when iterated in
    training: every layer still gets its mask, and the draws are fairseq's."""
    model, d = _build(extra=["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"])
    model.train()
    src = _segments(d, [[3, 4, 2], [5, 1]], seed=6)
    prev = _prev(_segments(d, [[2, 5, 3], [4, 2]], seed=7, left_pad=False), d)
    for seed in range(4):
        torch.manual_seed(seed)
        out, _ = model(src, src.ne(d.pad()).sum(1), prev)
        assert torch.isfinite(out).all()


def test_more_target_sentences_than_source_sentences_stay_finite():
    """A free decoder (no frame) may open a group the source does not have:
    its cross-attention falls back to the whole source, never NaN."""
    model, d = _build()
    src = _segments(d, [[4, 3], [5]], seed=14)
    prev = _prev(_segments(d, [[2, 2, 2, 2], [3, 3, 3]], seed=15, left_pad=False), d)
    out, extra = model(src, src.ne(d.pad()).sum(1), prev)
    assert torch.isfinite(out).all() and torch.isfinite(extra["attn"][0]).all()
