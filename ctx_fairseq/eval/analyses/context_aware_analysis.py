"""Analyses of the context-aware Transformer (Voita et al., 2018, Sec. 5-6).

Subcommands (``python -m ctx_fairseq.eval.analyses.context_aware_analysis CMD ...``;
console script ``ctx-context-aware-analysis``):

``bleu``
    BLEU of ``fairseq-generate`` (run in-process, twice) with the true context
    and with shuffled context (``--context-ablation shuffled``: each
    sentence's context taken from another, random document position), and the
    difference: a model that uses context loses BLEU with shuffled context.
``attention``
    teacher-forced pass over a split, reading the gate of the source
    encoder's context-aware layer. A source token's *attention to context* is
    ``1 - g`` averaged over the model dimensions (the share of the gated sum
    that comes from the context attention); we report its mean per source
    word type, the top-k words by it (the paper's top-10 table, with each
    word's mean position in its sentence), the mean per position in the
    sentence, and the mean gate value ``g`` (overall, and separately for
    sentences with and without context).
``contrastive``
    contrastive accuracy with the true previous sentence(s) of each record's
    document as context, and with shuffled context.

Each writes ``OUT_DIR/context_aware_{bleu,attention,contrastive}.{md,json,png}``
(the plot with matplotlib Agg; ``--png`` is accepted and does nothing) and
prints the table.
"""

import argparse
import collections
import contextlib
import io
import os
import shlex
import sys
from typing import Dict, List, Optional, Sequence

import torch

from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["load_document_model", "contrastive_with_context", "bleu_true_vs_shuffled",
           "context_attention_stats", "add_analysis_args", "cli_main"]

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_document_model(ckpt: str, data: str, ablation: str = "none", cpu: bool = True,
                        overrides: Optional[Dict] = None):
    """(model, task) from a checkpoint trained with ``--task document_translation``
    (:func:`ctx_fairseq.eval.checkpoints.restore_checkpoint`)."""
    from ctx_fairseq.eval.checkpoints import restore_checkpoint
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    model, task, _cfg = restore_checkpoint(
        ckpt, data, {"context_ablation": ablation, **(overrides or {})},
        "cpu" if cpu else "auto")
    if not isinstance(task, DocumentTranslationTask):
        raise ValueError(f"{ckpt}: trained with task {type(task).__name__}; expected "
                         "--task document_translation")
    return model, task


def check_target_context(task, gold_target_context: bool, what: str) -> None:
    """Reference translations are never used as target context unless asked:
    a model trained with target context needs ``gold_target_context``."""
    from ctx_fairseq.data.contract import sentence_level, task_options

    k = (task_options(task) or sentence_level()).target_context_size
    if k > 0 and not gold_target_context:
        raise ValueError(
            f"{what}: the checkpoint uses target context (--target-context-size "
            f"{k}); this analysis would take it from the reference "
            "translations: pass --gold-target-context to accept that, or (BLEU) "
            "--target-context-file FILE with the hypotheses of an earlier pass")


def contrastive_with_context(ckpt: str, data: str, jsonl: str, ablation: str = "none",
                             split: str = "test", batch_size: int = 32, cpu: bool = True,
                             gold_target_context: bool = False) -> Dict:
    """Contrastive accuracy on a toy-format file, with each record's document
    context: the one scorer, ``ctx_fairseq.eval.scoring.contrastive.evaluate_checkpoint``
    (record ``id`` = line of ``{split}``, ``doc_id`` and ``src`` checked). A
    checkpoint with target context needs ``gold_target_context``."""
    from ctx_fairseq.eval.scoring.contrastive import evaluate_checkpoint
    from ctx_fairseq.eval.scoring.suite_report import SuiteOptions

    return evaluate_checkpoint(ckpt, data, jsonl, SuiteOptions(
        fmt="toy", cpu=cpu, ablation=ablation, split=split,
        gold_target_context=gold_target_context, batch_size=batch_size))


# ----------------------------------------------------------------------------- BLEU


def _checkpoint_context_args(ckpt: str) -> List[str]:
    """The checkpoint's context options on the command line (the task's
    declared list, :func:`ctx_fairseq.tasks.context_options.context_option_args`)."""
    from fairseq import checkpoint_utils

    from ctx_fairseq.tasks.context_options import context_option_args

    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    return context_option_args(state["cfg"]["task"] if state.get("cfg") is not None else None)


def generate(ckpt: str, data: str, split: str = "test", ablation: str = "none",
             beam: int = 4, max_tokens: int = 4000, extra: Sequence[str] = (),
             gold_target_context: bool = False, target_context_file: Optional[str] = None) -> str:
    """fairseq-generate in-process; returns what it printed. Target context
    (for a checkpoint trained with it) comes only from what is asked:
    ``gold_target_context`` (the references) or ``target_context_file``;
    with neither, fairseq-generate stops with an error for such a checkpoint."""
    import ctx_fairseq  # noqa: F401
    from fairseq import options
    from fairseq_cli import generate as fs_generate

    argv = [data, "--user-dir", USER_DIR, "--task", "document_translation", "--path", ckpt,
            "--gen-subset", split, "--beam", str(beam), "--max-tokens", str(max_tokens),
            "--num-workers", "0", *_checkpoint_context_args(ckpt),
            "--context-ablation", ablation, *extra]
    if gold_target_context:
        argv.append("--gold-target-context")
    if target_context_file:
        argv += ["--target-context-file", target_context_file]
    args = options.parse_args_and_arch(options.get_generation_parser(), argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fs_generate.main(args)
    return out.getvalue()


def bleu_true_vs_shuffled(ckpt: str, data: str, split: str = "test", beam: int = 4,
                          out_dir: Optional[str] = None, extra: Sequence[str] = (),
                          gold_target_context: bool = False,
                          target_context_file: Optional[str] = None) -> Dict:
    from ctx_fairseq.generate_output import corpus_bleu, read_generate_output

    result = {"checkpoint": ckpt, "split": split, "beam": beam}
    for ablation in ("none", "shuffled"):
        text = generate(ckpt, data, split, ablation, beam, extra=extra,
                        gold_target_context=gold_target_context,
                        target_context_file=target_context_file)
        path = os.path.join(out_dir or ".", f"generate-{split}-{ablation}.txt")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        g = read_generate_output(path)
        key = "true" if ablation == "none" else "shuffled"
        result[key] = {"bleu": corpus_bleu(g.hypotheses, g.references),
                       "sentences": len(g.ids), "generate_output": path}
    result["difference"] = result["true"]["bleu"] - result["shuffled"]["bleu"]
    return result


def format_bleu(result: Dict) -> str:
    return "\n".join([
        "| context | BLEU | sentences |", "|---|---:|---:|",
        f"| true | {result['true']['bleu']:.2f} | {result['true']['sentences']} |",
        f"| shuffled | {result['shuffled']['bleu']:.2f} | {result['shuffled']['sentences']} |",
        f"| true - shuffled | {result['difference']:+.2f} | |",
    ])


# ------------------------------------------------------------------------ attention


@torch.no_grad()
def context_attention_stats(model, task, split: str = "test", max_tokens: int = 4000,
                            top_k: int = 10, min_count: int = 3) -> Dict:
    """Gate statistics of the source encoder's context-aware layer over
    ``split`` (teacher forcing, true context). See the module docstring."""
    layer = model.encoder.context_aware_layer
    if split not in task.datasets:
        task.load_dataset(split)
    ds = task.datasets[split]
    d = task.source_dictionary
    device = next(model.parameters()).device
    itr = task.get_batch_iterator(ds, max_tokens=max_tokens, seed=1,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    word_sum, word_count, word_pos = (collections.defaultdict(float),
                                      collections.defaultdict(int),
                                      collections.defaultdict(float))
    pos_sum, pos_count = collections.defaultdict(float), collections.defaultdict(int)
    gate_sum = {"all": 0.0, "with_context": 0.0, "without_context": 0.0}
    gate_n = {"all": 0, "with_context": 0, "without_context": 0}
    layer.record = True
    try:
        model.eval()
        for sample in itr:
            if not sample:
                continue
            ni = {k: v.to(device) if torch.is_tensor(v) else v  # numpy values stay
                  for k, v in sample["net_input"].items()}
            model(**ni)
            g = layer.last_gate.mean(-1).transpose(0, 1).cpu().double()  # B x T
            tokens = sample["net_input"]["src_tokens"]
            real = tokens.ne(d.pad()) & tokens.ne(d.eos())
            pos = real.long().cumsum(1) - 1
            has_ctx = sample["net_input"]["src_ctx_tokens"].ne(d.pad()).any(1)
            for key, rows in (("all", torch.ones_like(has_ctx)), ("with_context", has_ctx),
                              ("without_context", ~has_ctx)):
                m = real & rows.unsqueeze(1)
                gate_sum[key] += float(g[m].sum())
                gate_n[key] += int(m.sum())
            att = 1.0 - g
            for tok, a, p in zip(tokens[real].tolist(), att[real].tolist(), pos[real].tolist()):
                w = d[tok]
                word_sum[w] += a
                word_count[w] += 1
                word_pos[w] += p
                pos_sum[p] += a
                pos_count[p] += 1
    finally:
        layer.record = False
        layer.last_gate = layer.last_context_attn = None
    words = {w: {"attention_to_context": word_sum[w] / word_count[w],
                 "mean_position": word_pos[w] / word_count[w], "count": word_count[w]}
             for w in word_sum}
    ranked = sorted((w for w in words if words[w]["count"] >= min_count),
                    key=lambda w: (-words[w]["attention_to_context"], w))
    return {
        "split": split, "tokens": gate_n["all"], "min_count": min_count,
        "mean_gate": {k: (gate_sum[k] / gate_n[k] if gate_n[k] else None) for k in gate_sum},
        "mean_attention_to_context": (1 - gate_sum["all"] / gate_n["all"]) if gate_n["all"] else None,
        "top_words": [{"word": w, **words[w]} for w in ranked[:top_k]],
        "by_position": {str(p): pos_sum[p] / pos_count[p] for p in sorted(pos_sum)},
        "words": words,
    }


def format_attention(result: Dict) -> str:
    mg = result["mean_gate"]

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    lines = [f"mean gate g (source share): {f(mg['all'])} over {result['tokens']} source tokens "
             f"(with context: {f(mg['with_context'])}, without: {f(mg['without_context'])}); "
             f"mean attention to context 1-g: {f(result['mean_attention_to_context'])}", "",
             f"top {len(result['top_words'])} source words by attention to context "
             f"(at least {result['min_count']} occurrences):", "",
             "| rank | word | attention to context | mean position | count |",
             "|---:|---|---:|---:|---:|"]
    for r, w in enumerate(result["top_words"], 1):
        lines.append(f"| {r} | {w['word']} | {w['attention_to_context']:.3f} | "
                     f"{w['mean_position']:.1f} | {w['count']} |")
    return "\n".join(lines)


def format_contrastive(result: Dict) -> str:
    from ctx_fairseq.eval.scoring.contrastive import format_result

    return "\n".join(["true context:", format_result(result["true"]), "",
                      "shuffled context:", format_result(result["shuffled"])])


# --------------------------------------------------------------------------- output


def _plot(kind: str, result: Dict, png: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if kind == "attention":
        top = result["top_words"]
        ax.bar([w["word"] for w in top], [w["attention_to_context"] for w in top])
        ax.set_ylabel("attention to context (1 - g)")
        ax.tick_params(axis="x", rotation=45)
    elif kind == "bleu":
        ax.bar(["true", "shuffled"], [result["true"]["bleu"], result["shuffled"]["bleu"]])
        ax.set_ylabel("BLEU")
    else:
        names = ["true", "shuffled"]
        ax.bar(names, [100 * (result[n]["overall"]["accuracy"] or 0) for n in names])
        ax.set_ylabel("contrastive accuracy (%)")
    save_figure(fig, png, dpi=None)


def write_outputs(kind: str, result: Dict, table: str, out_dir: str, png: bool = True) -> Dict:
    return write_table_files(out_dir, f"context_aware_{kind}", table + "\n", result,
                             (lambda path: _plot(kind, result, path)) if png else None)


def add_analysis_args(p, checkpoint_help: str, png_help: str) -> None:
    """The options every subcommand of this analysis and of
    ``ctx-selective-analysis`` starts with: the checkpoint (``--path``,
    described by ``checkpoint_help``), ``--data``, ``--split``, ``--out-dir``
    and the former ``--png`` (``png_help``), which does nothing."""
    p.add_argument("--path", required=True, help=checkpoint_help)
    p.add_argument("--data", required=True, help="binarized data with {split}.docids")
    p.add_argument("--split", default="test", help="(default: test)")
    p.add_argument("--out-dir", default=".", help="where the table/JSON/PNG go")
    p.add_argument("--png", action="store_true", help=png_help)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-context-aware-analysis",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("bleu", "BLEU with true versus shuffled context"),
                        ("attention", "attention to context per source word; mean gate"),
                        ("contrastive", "contrastive accuracy with true and shuffled context")):
        s = sub.add_parser(name, help=help_)
        add_analysis_args(s, "transformer_context_aware checkpoint",
                          "(the plot is always written; kept for old command lines)")
        if name in ("bleu", "contrastive"):
            s.add_argument("--gold-target-context", action="store_true",
                           help="for a checkpoint with target context: take it from the "
                                "reference translations (never done unless asked)")
        if name == "bleu":
            s.add_argument("--target-context-file", default=None,
                           help="for a checkpoint with target context: hypotheses of an "
                                "earlier pass, one per line of the split")
            s.add_argument("--beam", type=int, default=4)
            s.add_argument("--generate-args", default="",
                           help="further fairseq-generate options, e.g. '--max-len-b 50'")
        if name == "attention":
            s.add_argument("--top-k", type=int, default=10)
            s.add_argument("--min-count", type=int, default=3,
                           help="words seen fewer times are left out of the top-k")
            s.add_argument("--max-tokens", type=int, default=4000)
        if name == "contrastive":
            s.add_argument("--contrastive", required=True, help="contrastive JSON Lines file")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> Dict:
    p = get_parser()
    a = p.parse_args(argv)
    try:
        if a.command == "bleu":
            result = bleu_true_vs_shuffled(a.path, a.data, a.split, a.beam, out_dir=a.out_dir,
                                           extra=shlex.split(a.generate_args),
                                           gold_target_context=a.gold_target_context,
                                           target_context_file=a.target_context_file)
            table = format_bleu(result)
        elif a.command == "attention":
            model, task = load_document_model(a.path, a.data)
            check_target_context(task, False, "attention analysis")
            result = context_attention_stats(model, task, a.split, a.max_tokens, a.top_k,
                                             a.min_count)
            table = format_attention(result)
        else:
            result = {k: contrastive_with_context(a.path, a.data, a.contrastive, ablation=abl,
                                                  split=a.split,
                                                  gold_target_context=a.gold_target_context)
                      for k, abl in (("true", "none"), ("shuffled", "shuffled"))}
            table = format_contrastive(result)
    except (OSError, ValueError) as err:
        p.error(str(err))
    paths = write_outputs(a.command, result, table, a.out_dir)
    print_written(paths.values(), table, one_line=True)
    return paths


if __name__ == "__main__":
    cli_main(sys.argv[1:])
