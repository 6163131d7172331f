"""Analyses of ``transformer_selective_doc`` (Maruf, Martins & Haffari, 2019,
Sec. 4.3 "Analysis", paragraph "Qualitative Analysis", Tables 6-7).

Subcommands (``python -m ctx_fairseq.eval.analyses.selective_analysis CMD ...``;
console script ``ctx-selective-analysis``):

``sentence --line N``
    one teacher-forced forward pass for corpus line ``N`` of ``--split``
    with its document memory (``task.context_net_input``). Encoder
    integration: the queries are the source tokens (only the encoder runs;
    the context layer does not depend on the target). Decoder integration:
    the queries are the decoder positions, teacher-forced with the reference
    translation, and the target memory holds the *reference* translations of
    the context sentences (gold target memory). Reports

    * the context sentences with the highest sentence-level attention mass:
      ``alpha_s`` (hierarchical), the flat sentence weights (flat-sentence),
      or the word weights summed per sentence (flat-word), averaged over the
      heads and over the sentence's real query tokens (padding excluded;
      ``</s>`` included, as in the module's statistics), with their offset
      from the current sentence (-1: the previous one), corpus line and text;
    * per head, the words with the highest hierarchical attention
      (``alpha_hier = alpha_s * alpha_w``, mean over the query tokens; for
      flat-word the flat word weights) in those sentences (not for
      flat-sentence, which has no word level: sentences only).

    ``--query-token K`` restricts the averages to query token ``K`` (0-based:
    the K-th source token, or for decoder integration the step that predicts
    the K-th target token), as the paper's examples look at one word.
``support``
    over a split (teacher forcing, the task's own batches): the mean support
    size of the sentence-level sparsemax (Eq. 3) and of the word-level
    normaliser (Eq. 4; per selected (token, head, sentence)), the mean number
    of visible sentences, all per (real query token with context, head) and
    weighted by the module's counts across batches, the mean gate value
    ``gamma`` of Eq. 7 (in Eq. 8 the share of ``r_i``, the encoder or decoder
    state, against the context layer's output ``d_i``) over the
    real tokens of sentences with context, and the distribution of the
    sentence support size (also the support as a fraction of the sentences
    visible to the token).

Each writes ``OUT_DIR/selective_sentence_{split}_{N}.{md,json,png}`` or
``OUT_DIR/selective_support_{split}.{md,json,png}`` and prints the table. The
PNG (matplotlib Agg) is always written: for ``sentence`` a heat map of the
sentence weights (head x visible context sentence) and, where the attention
has a word level, of the word weights (head x word) in the top sentence (a
sentence without visible context gets a panel saying so); for ``support`` a
bar chart of the sentence support sizes with the mean support and gate. The
former ``--png`` option is still accepted and does nothing.

The attention weights are read from the model's Document-level Context Layer
(``DocumentContextLayer``) during the forward pass: the analysis asks the
layer for ``need_weights``, ``need_word_weights`` and ``return_stats``
through forward hooks and restores everything afterwards.
"""

import argparse
import collections
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.eval.analyses.context_aware_analysis import add_analysis_args
from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["load_selective_model", "ContextRecorder", "sentence_analysis", "support_analysis",
           "format_sentence", "format_support", "cli_main", "main"]


# --------------------------------------------------------------------------- model


def load_selective_model(ckpt: str, data: str, cpu: bool = True):
    """(model, task) from a ``transformer_selective_doc`` checkpoint; task
    options from the checkpoint, ``data`` overrides its data path. Target
    memory, where the model uses it, always comes from the references."""
    from ctx_fairseq.eval.analyses.context_aware_analysis import load_document_model
    from ctx_fairseq.models.transformer_selective_doc.model import TransformerSelectiveDocModel

    if not os.path.isfile(ckpt):
        raise ValueError(f"{ckpt}: no such checkpoint file")
    model, task = load_document_model(ckpt, data, cpu=cpu,
                                      overrides={"target_context_file": None})
    if not isinstance(model, TransformerSelectiveDocModel):
        arch = getattr(getattr(model, "args", None), "arch", None) or type(model).__name__
        raise ValueError(f"{ckpt}: a {arch} checkpoint ({type(model).__name__}); this analysis "
                         "needs a transformer_selective_doc checkpoint")
    return model, task


def _context_layer(model):
    if getattr(model.encoder, "context_layer", None) is not None:
        return model.encoder.context_layer, "encoder"
    if getattr(model.decoder, "context_layer", None) is not None:
        return model.decoder.context_layer, "decoder"
    raise ValueError("the model has no Document-level Context Layer")


def _doc_args(model) -> Dict[str, str]:
    a = model.args
    return {k: str(getattr(a, name)) for k, name in (
        ("integration", "context_integration"), ("attention", "doc_attention"),
        ("sentence_attn", "sentence_attn"), ("word_attn", "word_attn"),
        ("context_memory", "context_memory"))}


def _mode(task) -> str:
    """``online`` | ``offline`` (fairseq keeps choices as enums)."""
    return str(task_options(task).document_context)


def _setting(model, task, ds, split: str) -> Tuple[Dict[str, str], bool]:
    """``(settings, online)``: the model's context options (:func:`_doc_args`)
    and whether the task's document context is online, after checking that
    a decoder-integration model has the references of ``split`` (``ds``) to
    be teacher-forced with."""
    cfg = _doc_args(model)
    if cfg["integration"] == "decoder" and ds.base.tgt is None:
        raise ValueError(f"{split} has no reference translations; decoder integration is "
                         "analysed teacher-forced with the reference")
    return cfg, _mode(task) == "online"


class ContextRecorder:
    """Context manager: while active, every call of the model's
    Document-level Context Layer is made with ``need_weights``,
    ``need_word_weights`` (if ``word_weights``) and ``return_stats``, and its
    ``info`` and ``query_padding_mask`` are kept in ``self.info`` /
    ``self.query_padding_mask`` (last call). Hooks and ``record_stats`` are
    restored on exit."""

    def __init__(self, model, word_weights: bool = False):
        self.model = model
        self.layer, self.integration = _context_layer(model)
        self.word_weights = word_weights
        self.info: Optional[Dict[str, torch.Tensor]] = None
        self.query_padding_mask: Optional[torch.Tensor] = None
        self.calls = 0
        self._handles: List[Any] = []
        self._saved: List[Tuple[Any, bool]] = []

    def _pre(self, module, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["need_weights"] = True
        kwargs["return_stats"] = True
        if self.word_weights:
            kwargs["need_word_weights"] = True
        self.query_padding_mask = kwargs.get("query_padding_mask")
        return args, kwargs

    def _post(self, module, args, kwargs, output):
        self.info = output[1]
        self.calls += 1

    def __enter__(self):
        for part in (self.model.encoder, self.model.decoder):
            if hasattr(part, "record_stats"):
                self._saved.append((part, part.record_stats))
                part.record_stats = True
        self._handles = [
            self.layer.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.layer.register_forward_hook(self._post, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        for part, was in self._saved:
            part.record_stats = was
        self._handles, self._saved = [], []


def _forward(model, integration: str, net_input: Dict[str, torch.Tensor]) -> None:
    """Encoder integration: the encoder only (the context layer does not see
    the target); decoder integration: the whole model, teacher-forced."""
    if integration == "encoder":
        enc_in = {k: v for k, v in net_input.items() if k != "prev_output_tokens"}
        model.encoder(**enc_in)
    else:
        model(**net_input)


def _real_words(tokens: torch.Tensor, d) -> torch.Tensor:
    return tokens.ne(d.pad()) & tokens.ne(d.eos()) & tokens.ne(d.bos())


def _memory_tokens(net_input: Dict[str, torch.Tensor], integration: str, task,
                   width: Optional[int] = None) -> Tuple[torch.Tensor, Any]:
    """The memory's word tokens (``S x width``) as the context layer sees
    them: source sentences (encoder integration) or the teacher-forcing input
    of the target sentences (decoder integration; word ``t`` is at the input
    position of target word ``t``), padded to ``width`` on the side the data
    pads."""
    if integration == "encoder":
        toks, d, left = net_input["mem_src_tokens"], task.source_dictionary, \
            task_options(task).left_pad_source
    else:
        toks, d, left = net_input["mem_tgt_prev_tokens"], task.target_dictionary, \
            task_options(task).left_pad_target
    if width is not None and toks.size(1) < width:
        extra = width - toks.size(1)
        toks = torch.nn.functional.pad(toks, (extra, 0) if left else (0, extra), value=d.pad())
    return toks, d


def _visible_counts(net_input: Dict[str, torch.Tensor], mem_words: torch.Tensor,
                    online: bool) -> torch.Tensor:
    """Visible memory sentences per query sentence (``B``): same document, at
    least one real word, earlier (online) or other (offline) position."""
    qd, qp = net_input["query_doc"].cpu(), net_input["query_pos"].cpu()
    md, mp = net_input["mem_doc"].cpu(), net_input["mem_pos"].cpu()
    same = qd.unsqueeze(1) == md.unsqueeze(0)
    rel = mp.unsqueeze(0) < qp.unsqueeze(1) if online else mp.unsqueeze(0) != qp.unsqueeze(1)
    return (same & rel & mem_words.any(1).cpu().unsqueeze(0)).sum(1)


def _load_split(task, split: str):
    if split not in task.datasets:
        task.load_dataset(split)
    return task.datasets[split]


def _text(d, tokens) -> str:
    return d.string(tokens) if tokens is not None else ""


# ------------------------------------------------------------------------ sentence


#: what a sentence analysis measures, by integration
_SETTING_TEXT = {
    "encoder": ("encoder integration: queries are the source tokens of the sentence "
                "(encoder forward; the target is not needed); memory: the source sentences "
                "of the document"),
    "decoder": ("decoder integration: teacher-forced with the reference translation (query "
                "k predicts target token k); target memory: the reference translations of "
                "the context sentences (gold target memory), with their sources"),
}


def _query_selection(ni, batch, integration: str, task, padding_mask,
                     query_token: Optional[int]):
    """``(query words, selected positions)``: the real query tokens' labels
    and the positions averaged over (all real tokens, or ``query_token``)."""
    if integration == "encoder":
        d, q_tokens = task.source_dictionary, ni["src_tokens"][0].cpu()
    else:
        d, q_tokens = task.target_dictionary, batch["target"][0]
    q_labels = [d[t] for t in q_tokens.tolist()]
    real = (~padding_mask[0].bool().cpu()) if padding_mask is not None else \
        torch.ones(len(q_labels), dtype=torch.bool)
    if real.numel() != len(q_labels):  # query width differs from the token row: align right/left
        raise RuntimeError("query padding mask and query tokens differ in length")
    real_pos = real.nonzero().squeeze(1)
    query_words = [q_labels[int(t)] for t in real_pos]
    if query_token is None:
        return query_words, real_pos
    if not 0 <= query_token < len(real_pos):
        raise ValueError(f"--query-token {query_token}: the query has {len(real_pos)} "
                         f"tokens (0..{len(real_pos) - 1}): {' '.join(query_words)}")
    return query_words, real_pos[query_token:query_token + 1]


def _top_words_by_head(top, memory, ww, H: int, top_words: int):
    """Per head, the ``top_words`` memory words of the top sentences with the
    largest word weights (``memory``: the memory's word rows, which of them
    are real words, and its dictionary); fills each top sentence's words and
    word weights per head."""
    mem_words, mem_real_w, mem_d = memory
    for e in top:
        j, r = e.pop("_column"), e.pop("_row")
        cols = mem_real_w[r].nonzero().squeeze(1)
        e["words"] = [mem_d[int(mem_words[r, c])] for c in cols]
        e["word_weights_per_head"] = [[float(ww[h, j, c]) for c in cols] for h in range(H)]
    out = []
    for h in range(H):
        cands = []
        for e in top:
            for n, (w, a) in enumerate(zip(e["words"], e["word_weights_per_head"][h])):
                if a > 0:
                    cands.append({"word": w, "offset": e["offset"], "line": e["line"],
                                  "position": n, "weight": a})
        cands.sort(key=lambda c: (-c["weight"], abs(c["offset"]), c["position"]))
        out.append(cands[:top_words])
    return out


@torch.no_grad()
def sentence_analysis(model, task, split: str = "test", line: int = 0, top_sentences: int = 3,
                      top_words: int = 5, query_token: Optional[int] = None) -> Dict:
    """See the module docstring (``sentence``)."""
    if top_sentences < 1 or top_words < 1:
        raise ValueError("--top-sentences and --top-words must be >= 1")
    ds = _load_split(task, split)
    if not 0 <= line < len(ds):
        raise ValueError(f"line {line} is outside {split} ({len(ds)} sentences: 0..{len(ds) - 1})")
    cfg, online = _setting(model, task, ds, split)
    integration = cfg["integration"]
    batch = ds.base.collater([ds.base[line]])
    ni = dict(batch["net_input"])
    ni.update(task.context_net_input(split, [line]))
    device = next(model.parameters()).device
    ni = {k: v.to(device) if torch.is_tensor(v) else v for k, v in ni.items()}
    model.eval()
    with ContextRecorder(model, word_weights=True) as rec:
        _forward(model, integration, ni)
    info = rec.info
    if info is None:
        raise RuntimeError("the Document-level Context Layer was not called")

    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    doc = int(ds.doc_index[line])
    qpos = int(ds.sent_pos[line])
    doc_start = line - qpos
    has_context = bool(info["has_context"][0])

    query_words, sel = _query_selection(ni, batch, integration, task, rec.query_padding_mask,
                                        query_token)

    sw = info["sent_weights"][0].detach().double().cpu()  # H x T x S_max
    si = info["sent_index"][0].cpu()  # S_max
    H = sw.size(0)
    mass_h = sw[:, sel, :].mean(1)  # H x S_max
    mass = mass_h.mean(0)  # S_max
    supp_h = (sw[:, sel, :] != 0).sum(-1).double().mean(1)  # H

    mem_words_all, mem_d = _memory_tokens(ni, integration, task)
    mem_real = _real_words(mem_words_all, mem_d).cpu()
    mem_pos = ni["mem_pos"].cpu()
    ww = info.get("word_weights")
    word_level = ww is not None
    if word_level:
        ww = ww[0].detach().double().cpu()[:, sel].mean(1)  # H x S_max x L
        mem_words, _ = _memory_tokens(ni, integration, task, width=ww.size(-1))
        mem_words = mem_words.cpu()
        mem_real_w = _real_words(mem_words, mem_d)

    sentences = []
    for j in range(si.numel()):
        r = int(si[j])
        if r < 0:
            continue
        p = int(mem_pos[r])
        if p == qpos:
            continue  # the current sentence (offline memory holds it) is never context
        offset = p - qpos
        visible = (offset < 0 if online else True) and bool(mem_real[r].any())
        k = doc_start + p
        entry = {"offset": offset, "line": k, "visible": visible,
                 "mass": float(mass[j]), "mass_per_head": [float(x) for x in mass_h[:, j]],
                 "source": _text(src_d, ds.base.src[k]),
                 "target": _text(tgt_d, ds.base.tgt[k]) if ds.base.tgt is not None else None,
                 "_column": j, "_row": r}
        sentences.append(entry)
    sentences.sort(key=lambda e: e["offset"])
    ranked = sorted((e for e in sentences if e["mass"] > 0), key=lambda e: (-e["mass"],
                                                                             abs(e["offset"])))
    top = ranked[:top_sentences]

    words_by_head = None
    if word_level:
        words_by_head = _top_words_by_head(top, (mem_words, mem_real_w, mem_d), ww, H, top_words)
    for e in sentences:
        e.pop("_column", None)
        e.pop("_row", None)

    setting = _SETTING_TEXT[integration]
    return {
        "checkpoint_setting": {**cfg, "document_context": _mode(task),
                               "heads": H},
        "setting": setting,
        "split": split, "line": line, "document": ds.doc_names[doc], "position": qpos,
        "document_sentences": int(ds.doc_len[doc]),
        "source": _text(src_d, ds.base.src[line]),
        "target": _text(tgt_d, ds.base.tgt[line]) if ds.base.tgt is not None else None,
        "query_tokens": query_words,
        "query_token": query_token,
        "averaged_over_tokens": int(sel.numel()),
        "has_context": has_context,
        "visible_sentences": sum(1 for e in sentences if e["visible"]),
        "support_sentences": sum(1 for e in sentences if e["mass"] > 0),
        "support_size_per_head": [float(x) for x in supp_h] if has_context else None,
        "sentences": sentences,
        "top_sentences": top,
        "top_words_by_head": words_by_head,
    }


def _describe(c: Dict[str, str]) -> str:
    if c["attention"] == "hierarchical":
        return (f"hierarchical attention (sentence {c['sentence_attn']}, "
                f"word {c['word_attn']})")
    over = "sentences" if c["attention"] == "flat-sentence" else "all words"
    return f"{c['attention']} attention (softmax over the {over}, Eq. 6)"


def _cell(text: Optional[str]) -> str:
    return (text or "").replace("|", "\\|")


def format_sentence(result: Dict) -> str:
    c = result["checkpoint_setting"]
    lines = [
        f"line {result['line']} of {result['split']}: document {result['document']}, sentence "
        f"{result['position'] + 1} of {result['document_sentences']}; {c['document_context']} "
        f"context, {_describe(c)}, {c['context_memory']} memory",
        result["setting"], "",
        f"source: {result['source']}",
    ]
    if result["target"] is not None:
        lines.append(f"reference: {result['target']}")
    lines.append("")
    if not result["has_context"]:
        lines.append("no visible context sentence: the sentence is translated by the "
                     "sentence-level model (context layer bypassed); nothing to report")
        return "\n".join(lines)
    who = (f"query token {result['query_token']} ({result['query_tokens'][result['query_token']]})"
           if result["query_token"] is not None else
           f"{result['averaged_over_tokens']} query tokens")
    decoder = c["integration"] == "decoder"
    lines += [
        f"visible context sentences: {result['visible_sentences']}; with nonzero mass: "
        f"{result['support_sentences']}; mean support size per head: "
        + " / ".join(f"{x:.2f}" for x in result["support_size_per_head"]), "",
        f"top {len(result['top_sentences'])} context sentences by sentence-level attention mass "
        f"(mean over {c['heads']} heads and {who}):", "",
        "| rank | offset | line | mass | per head | " + ("reference (source)" if decoder
                                                          else "source") + " |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for r, e in enumerate(result["top_sentences"], 1):
        text = f"{e['target']} ({e['source']})" if decoder else e["source"]
        lines.append(f"| {r} | {e['offset']:+d} | {e['line']} | {e['mass']:.3f} | "
                     + " / ".join(f"{x:.2f}" for x in e["mass_per_head"])
                     + f" | {_cell(text)} |")
    if result["top_words_by_head"] is None:
        lines += ["", "flat-sentence attention has no word level: sentences only"]
        return "\n".join(lines)
    weight = ("hierarchical attention (alpha_hier" if c["attention"] == "hierarchical"
              else "flat word attention (softmax over all words")
    lines += ["", f"words with the highest {weight}, mean over {who}) "
              "in those sentences, per head (word [offset]: weight):", "",
              "| head | words |", "|---:|---|"]
    for h, words in enumerate(result["top_words_by_head"]):
        cells = ", ".join(f"{_cell(w['word'])} [{w['offset']:+d}]: {w['weight']:.3f}"
                          for w in words)
        lines.append(f"| {h} | {cells or '-'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------- support


@torch.no_grad()
def support_analysis(model, task, split: str = "test", max_tokens: int = 4000) -> Dict:
    """See the module docstring (``support``)."""
    ds = _load_split(task, split)
    cfg, online = _setting(model, task, ds, split)
    integration = cfg["integration"]
    device = next(model.parameters()).device
    itr = task.get_batch_iterator(ds, max_tokens=max_tokens, seed=1,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    tot = collections.defaultdict(float)
    hist: Dict[int, int] = collections.Counter()
    frac_sum, frac_max = 0.0, 0.0
    n_batches = 0
    model.eval()
    with ContextRecorder(model) as rec:
        for sample in itr:
            if not sample:
                continue
            ni = {k: v.to(device) if torch.is_tensor(v) else v
                  for k, v in sample["net_input"].items()}
            rec.info = None
            _forward(model, integration, ni)
            info = rec.info
            if info is None:
                raise RuntimeError("the Document-level Context Layer was not called")
            n_batches += 1
            # the module's statistics, weighted by its own counts
            n_th = float(info["num_token_heads"])
            tot["token_heads"] += n_th
            tot["sentence_support"] += float(info["sentence_support"]) * n_th
            tot["visible"] += float(info["visible_sentences"]) * n_th
            if "word_support" in info:
                n_pairs = float(info["num_support_pairs"])
                tot["support_pairs"] += n_pairs
                tot["word_support"] += float(info["word_support"]) * n_pairs
            # tokens: real query tokens, split by whether their sentence has context
            has_ctx = info["has_context"].cpu()
            pm = rec.query_padding_mask
            gate = info["gate"].detach().double().mean(-1).cpu()  # T x B
            real = (~pm.bool().cpu()) if pm is not None else \
                torch.ones(gate.size(1), gate.size(0), dtype=torch.bool)  # B x T
            with_ctx = real & has_ctx.unsqueeze(1)
            tot["sentences"] += has_ctx.numel()
            tot["sentences_with_context"] += int(has_ctx.sum())
            tot["tokens"] += int(real.sum())
            tot["tokens_with_context"] += int(with_ctx.sum())
            tot["gate_with_context"] += float(gate.t()[with_ctx].sum())
            tot["gate_all"] += float(gate.t()[real].sum())
            # distribution from the weights themselves (independent of the statistics)
            mem_tokens, mem_d = _memory_tokens(ni, integration, task)
            vis = _visible_counts(ni, _real_words(mem_tokens, mem_d), online)  # B
            tot["visible_per_sentence"] += float(vis[has_ctx].sum())
            sw = info["sent_weights"].detach().cpu()  # B x H x T x S_max
            supp = (sw != 0).sum(-1).transpose(1, 2)  # B x T x H
            picked = supp[with_ctx]  # N x H
            if picked.numel():
                hist.update(collections.Counter(picked.flatten().tolist()))
                denom = vis.unsqueeze(1).expand_as(with_ctx)[with_ctx].unsqueeze(1).double()
                frac = picked.double() / denom
                frac_sum += float(frac.sum())
                frac_max = max(frac_max, float(frac.max()))

    def mean(num: str, den: str) -> Optional[float]:
        return tot[num] / tot[den] if tot[den] else None

    n_hist = sum(hist.values())
    word_level = cfg["attention"] != "flat-sentence"
    return {
        "checkpoint_setting": {**cfg, "document_context": _mode(task)},
        "split": split, "max_tokens": max_tokens, "batches": n_batches,
        "setting": ("teacher forcing with the references" + (
            "; target memory: the reference translations (gold)" if integration == "decoder"
            else "; encoder forward only (the context layer does not see the target)")),
        "sentences": int(tot["sentences"]),
        "sentences_with_context": int(tot["sentences_with_context"]),
        "tokens": int(tot["tokens"]), "tokens_with_context": int(tot["tokens_with_context"]),
        "token_heads": int(tot["token_heads"]),
        "mean_sentence_support": mean("sentence_support", "token_heads"),
        "mean_word_support": mean("word_support", "support_pairs") if word_level else None,
        "support_pairs": int(tot["support_pairs"]) if word_level else None,
        "mean_visible_sentences": mean("visible", "token_heads"),
        "mean_visible_sentences_per_sentence": mean("visible_per_sentence",
                                                    "sentences_with_context"),
        "mean_support_fraction": frac_sum / n_hist if n_hist else None,
        "max_support_fraction": frac_max if n_hist else None,
        "mean_gate": mean("gate_with_context", "tokens_with_context"),
        "mean_gate_all_tokens": mean("gate_all", "tokens"),
        "sentence_support_histogram": {str(k): int(hist[k]) for k in sorted(hist)},
    }


def format_support(result: Dict) -> str:
    c = result["checkpoint_setting"]

    def f(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)

    lines = [
        f"{result['split']}: {result['sentences']} sentences ({result['sentences_with_context']} "
        f"with context), {result['tokens']} query tokens ({result['tokens_with_context']} with "
        f"context), {result['batches']} batch(es); {c['document_context']} context, "
        f"{c['integration']} integration, {_describe(c)}; {result['setting']}", "",
        "| statistic | value |", "|---|---:|",
        f"| mean sentence support (nonzero sentence weights per token and head) | "
        f"{f(result['mean_sentence_support'])} |",
        f"| mean word support (nonzero word weights per selected token, head, sentence) | "
        f"{f(result['mean_word_support'])} |",
        f"| mean visible sentences (per token and head) | "
        f"{f(result['mean_visible_sentences'])} |",
        f"| mean visible sentences (per sentence with context) | "
        f"{f(result['mean_visible_sentences_per_sentence'])} |",
        f"| mean support / visible sentences | {f(result['mean_support_fraction'])} |",
        f"| mean gate gamma (tokens with context; share of the sentence-level state) | "
        f"{f(result['mean_gate'])} |",
        f"| mean gate gamma (all tokens; 1 without context) | "
        f"{f(result['mean_gate_all_tokens'])} |",
        "", "sentence support size per (token with context, head):", "",
        "| support size | count | share |", "|---:|---:|---:|",
    ]
    total = sum(result["sentence_support_histogram"].values())
    for k, n in result["sentence_support_histogram"].items():
        lines.append(f"| {k} | {n} | {n / total:.3f} |")
    if not total:
        lines.append("| - | 0 | - |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- output


def _note(ax, text: str) -> None:
    """An empty panel that says why there is nothing to draw."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _plot(kind: str, result: Dict, path: str) -> None:
    """Always writes ``path``. ``sentence``: heat map of the sentence-level
    weights (head x visible context sentence) and, with a word level, of the
    word weights (head x word) in the top sentence; without a visible context
    sentence, a panel saying so. ``support``: bar chart of the sentence
    support size per (token with context, head), with the mean support and
    gate in the title; without tokens with context, a panel saying so."""
    plt = pyplot()
    if kind == "sentence":
        shown = [e for e in result["sentences"] if e["visible"]]
        top = result["top_sentences"][0] if result["top_sentences"] else None
        words = top is not None and top.get("words") is not None
        title = f"line {result['line']} of {result['split']}"
        if not shown:
            fig, ax = plt.subplots(figsize=(6, 2.5))
            _note(ax, f"{title} (sentence {result['position'] + 1} of its document):\nno "
                      "visible context sentence; the context layer is bypassed")
        else:
            heads = len(shown[0]["mass_per_head"])
            ncols = 2 if words else 1
            width = max(4, 0.5 * len(shown) + 2) + (max(4, 0.45 * len(top["words"]) + 2)
                                                    if words else 0)
            fig, axes = plt.subplots(1, ncols, figsize=(width, 0.5 * heads + 2.2), squeeze=False)
            ax = axes[0][0]
            grid = np.array([[e["mass_per_head"][h] for e in shown] for h in range(heads)])
            im = ax.imshow(grid, aspect="auto", cmap="Blues", vmin=0)
            ax.set_xticks(range(len(shown)))
            ax.set_xticklabels([f"{e['offset']:+d}" for e in shown])
            ax.set_yticks(range(heads))
            ax.set_xlabel("context sentence (offset)")
            ax.set_ylabel("head")
            ax.set_title(f"sentence weights, {title}", fontsize=9)
            fig.colorbar(im, ax=ax)
            if words:
                ax = axes[0][1]
                grid = np.array(top["word_weights_per_head"])
                im = ax.imshow(grid, aspect="auto", cmap="Oranges", vmin=0)
                ax.set_xticks(range(len(top["words"])))
                ax.set_xticklabels(top["words"], rotation=60, ha="right", fontsize=8)
                ax.set_yticks(range(heads))
                ax.set_ylabel("head")
                ax.set_title(f"word weights in the top sentence ({top['offset']:+d})",
                             fontsize=9)
                fig.colorbar(im, ax=ax)
    else:
        hist = result["sentence_support_histogram"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        if not hist:
            _note(ax, f"{result['split']}: no token with a visible context sentence;\n"
                      "no sentence support to count")
        else:
            ax.bar([int(k) for k in hist], list(hist.values()))
            ax.set_xticks([int(k) for k in hist])
            ax.set_xlabel("sentence support size")
            ax.set_ylabel("(token, head) pairs")

            def f(x):
                return "-" if x is None else f"{x:.2f}"

            ax.set_title(f"{result['split']}: mean support {f(result['mean_sentence_support'])}"
                         f" of {f(result['mean_visible_sentences'])} visible; mean gate "
                         f"{f(result['mean_gate'])}", fontsize=9)
    save_figure(fig, path, dpi=None)


def write_outputs(name: str, kind: str, result: Dict, table: str,
                  out_dir: str) -> Dict[str, str]:
    return write_table_files(out_dir, name, table + "\n", result,
                             lambda path: _plot(kind, result, path), ensure_ascii=False)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-selective-analysis",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("sentence", "context sentences and words a sentence attends to"),
                        ("support", "sparsemax support sizes and gate over a split")):
        s = sub.add_parser(name, help=help_)
        add_analysis_args(s, "transformer_selective_doc checkpoint",
                          "accepted for compatibility; the PNG is always written")
        if name == "sentence":
            s.add_argument("--line", type=int, required=True,
                           help="corpus line of the split (0-based)")
            s.add_argument("--top-sentences", type=int, default=3)
            s.add_argument("--top-words", type=int, default=5)
            s.add_argument("--query-token", type=int, default=None,
                           help="average over this query token only (0-based; default: all)")
        else:
            s.add_argument("--max-tokens", type=int, default=4000)
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Runs the analysis; returns the paths written (``md``, ``json``, ``png``)."""
    p = get_parser()
    a = p.parse_args(argv)
    try:
        model, task = load_selective_model(a.path, a.data)
        if a.command == "sentence":
            result = sentence_analysis(model, task, a.split, a.line, a.top_sentences,
                                       a.top_words, a.query_token)
            table = format_sentence(result)
            name = f"selective_sentence_{a.split}_{a.line}"
        else:
            result = support_analysis(model, task, a.split, a.max_tokens)
            table = format_support(result)
            name = f"selective_support_{a.split}"
    except (OSError, ValueError) as err:
        p.error(str(err))
    paths = write_outputs(name, a.command, result, table, a.out_dir)
    print_written(paths.values(), table, one_line=True)
    return paths


def main() -> None:
    """Console script ``ctx-selective-analysis`` (returns None, so that the
    exit status is 0)."""
    cli_main(sys.argv[1:])


if __name__ == "__main__":
    main()
