"""Generative accuracy on the contrastive suites: does the model's own
translation of a suite's source, in context, use the word that the correct
candidate has and the contrastive ones do not?

``ctx-generative-accuracy --format FMT --contrastive FILE`` with either

* ``--path CKPT --data BIN``: the suite's sources are translated here, with
  fairseq's beam search (``task.build_generator`` / ``task.inference_step``,
  as ``fairseq-generate``) over the dataset the contrastive scorer builds
  (:meth:`ctx_fairseq.eval.scoring.contrastive.ContrastiveScorer.rank_datasets`:
  the same documents, context and checks as ``ctx-score-contrastive``); the
  translations are written in ``fairseq-generate``'s format beside the report;
* ``--generate-output FILE``: translations already made, in
  ``fairseq-generate``'s output format (``D-`` lines when there are any, else
  ``H-``). Sentence ids are lines of the binarized split for ``--format toy``
  (``fairseq-generate --gen-subset test`` on the split the records point to,
  e.g. the demo's ``generate/ARCH.txt``) and example numbers (0-based, the
  suite's order) for the other formats (the file this command writes with
  ``--path``). Each ``S-`` line must end with the example's source words: a
  file of another split or suite is an error.

Distinguishing words (the suites' candidates differ in a few words: the
pronoun of ContraPro (Müller et al. 2018) and Bawden et al. 2018, the
deictic, elided or repeated word of Voita et al. 2019, Lopes et al. 2020's
pronouns and lexical choices; here the difference is read off the candidates
themselves, for every format alike)
    A text's *words* are its maximal runs of letters and digits (Unicode
    ``[^\\W_]+``) after HTML entities are unescaped (``&apos;`` of the Moses
    tokenizer), BPE markers removed (subword-nmt ``@@``, SentencePiece
    ``▁``: fairseq's own ``post_process``) and, unless ``--case-sensitive``,
    case folded (``str.casefold``). Punctuation, tokenization and word order
    therefore never matter; an apostrophe splits a word (``l'homme``: ``l``,
    ``homme``). For the correct candidate ``c`` and each contrastive candidate
    ``k`` (as sets of words)::

        plus_k  = words(c) - words(k)    # what makes c right against k
        minus_k = words(k) - words(c)    # what makes k wrong

    ``required`` is the union of the ``plus_k``, ``forbidden`` the union of
    the ``minus_k`` (disjoint by construction). An example whose candidates
    have no distinguishing word (both sets empty: they differ only in case,
    punctuation, word order or how often a word occurs) cannot be judged this
    way: it is counted apart (``undecidable``) and never as right.

Outcome of a translation ``h`` (its set of words)
    * ``correct``: every required word in ``h``, no forbidden word;
    * ``contrastive``: for some ``k`` with ``minus_k`` non-empty, every word
      of ``minus_k`` in ``h`` and no word of ``plus_k`` (the translation took
      a contrastive candidate's words);
    * ``both``: some required and some forbidden word in ``h``;
    * ``other``: anything else (a paraphrase, another word, a dropped word).

    Accuracy = correct / (examples - undecidable). Only ``correct`` is right:
    a paraphrase or a synonym of the correct word counts as wrong, a
    translation that puts both words somewhere counts as wrong, and the rest
    of the sentence is not judged. Reported overall, per category and by
    antecedent distance (overall and per category), with each outcome's count.

Context
    As the contrastive scorer (:mod:`ctx_fairseq.eval.scoring.contrastive`): the
    checkpoint's own task options; for ``toy`` the split's real documents
    (target context from the references with ``--gold-target-context``), for
    the public suites the suite's context sentences of the correct candidate
    (Bawden et al.'s pairs may give the two candidates different contexts;
    the correct one's is the example's context) with the same refusals
    (following context, more sentences than the suite gives, whole-document
    models without ``--allow-partial-document``). Target context, where the
    model reads it, is the references' or the suite's: the translation of the
    current sentence is the model's own, its context is not.
    ``--context-ablation shuffled`` translates with wrong context. The
    scorer's datasets are built as generation datasets (the task's ``wrap``
    with ``generation=True``, as for ``fairseq-generate``'s split): a
    ``--concat-context`` model's target context is the decoder's forced
    prefix, removed from the translation.

Outputs
    ``OUT_DIR/generative_{name}.{md,json,png}`` (table, JSON with each
    example's translation, words and outcome, bar chart by distance), and with
    ``--path`` ``OUT_DIR/generative_{name}.translations.txt``.
"""

import argparse
import html
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from ctx_fairseq.eval.scoring.contrastive import ContrastiveScorer, scorer_for_checkpoint
from ctx_fairseq.eval.scoring.contrastive_suites import FORMATS, Example, Suite
from ctx_fairseq.generate_output import BPE_SCHEMES, lines_with_bpe, read_generate_output, \
    remove_bpe
from ctx_fairseq.eval.scoring.suite_report import (accuracy_bar_plot, add_output_args, add_suite_args,
                                           group_outcomes, pct, print_report, report_name,
                                           result_rows, SuiteOptions, parse_suite_args,
                                           write_report_files)
from ctx_fairseq.tasks.generation import best_tokens_on_cpu

logger = logging.getLogger(__name__)

__all__ = ["words", "distinguishing_words", "judge", "summarize", "translations_from_file",
           "translate_suite", "write_translations", "Decoding", "evaluate", "format_result", "write_report", "cli_main"]

OUTCOMES = ("correct", "contrastive", "both", "other")
_WORD = re.compile(r"[^\W_]+")


def words(text: str, case_sensitive: bool = False) -> List[str]:
    """The words of ``text`` (module docstring)."""
    text = html.unescape(str(text))
    for scheme in BPE_SCHEMES:
        if lines_with_bpe([text]).get(scheme):
            text = remove_bpe([text], scheme)[0]
    if not case_sensitive:
        text = text.casefold()
    return _WORD.findall(text)


def distinguishing_words(ex: Example, case_sensitive: bool = False
                         ) -> Tuple[Set[str], Set[str], List[Tuple[Set[str], Set[str]]]]:
    """``(required, forbidden, [(plus_k, minus_k) per contrastive candidate])``."""
    correct = set(words(ex.candidates[ex.correct].target, case_sensitive))
    pairs = []
    for k, cand in enumerate(ex.candidates):
        if k == ex.correct:
            continue
        other = set(words(cand.target, case_sensitive))
        pairs.append((correct - other, other - correct))
    required = set().union(*(p for p, _ in pairs))
    forbidden = set().union(*(m for _, m in pairs))
    return required, forbidden, pairs


def judge(hyp: str, ex: Example, case_sensitive: bool = False) -> str:
    """``undecidable`` or one of :data:`OUTCOMES` (module docstring)."""
    required, forbidden, pairs = distinguishing_words(ex, case_sensitive)
    if not required and not forbidden:
        return "undecidable"
    h = set(words(hyp, case_sensitive))
    has_req, has_forb = bool(required & h), bool(forbidden & h)
    if required <= h and not has_forb:
        return "correct"
    if any(minus and minus <= h and not (plus & h) for plus, minus in pairs):
        return "contrastive"
    if has_req and has_forb:
        return "both"
    return "other"


# ------------------------------------------------------------------ report
def _group(outcomes: Sequence[str]) -> Dict:
    g = {"n": sum(o != "undecidable" for o in outcomes)}
    for o in OUTCOMES + ("undecidable",):
        g[o] = sum(x == o for x in outcomes)
    g["accuracy"] = g["correct"] / g["n"] if g["n"] else None
    return g


def summarize(suite: Suite, hypotheses: Sequence[str], case_sensitive: bool = False) -> Dict:
    """Outcome of every example and the accuracies; ``hypotheses[i]`` is the
    translation of ``suite.examples[i]``."""
    if len(hypotheses) != len(suite.examples):
        raise ValueError(f"{len(hypotheses)} translations for {len(suite.examples)} examples")
    outcomes = [judge(h, ex, case_sensitive) for h, ex in zip(hypotheses, suite.examples)]
    result = {"suite": suite.path, "format": suite.format, "case_sensitive": case_sensitive,
              **group_outcomes(suite, outcomes, _group)}
    examples = []
    for ex, h, o in zip(suite.examples, hypotheses, outcomes):
        required, forbidden, _ = distinguishing_words(ex, case_sensitive)
        examples.append({"where": ex.where, "translation": h, "outcome": o,
                         "required": sorted(required), "forbidden": sorted(forbidden)})
    result["examples"] = examples
    return result


def format_result(result: Dict) -> str:
    o = result["overall"]
    acc = "-" if o["accuracy"] is None else f"{o['accuracy']:.3f}"
    lines = [f"generative accuracy: {acc} ({o['correct']}/{o['n']} translations with the correct "
             f"candidate's distinguishing words and none of the others'; {o['undecidable']} "
             "example(s) without distinguishing words left out)"]
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    lines += ["", "| category | distance | n | correct | contrastive | both | other | "
              "undecidable | accuracy % |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    for cat, dist, g in result_rows(result):
        lines.append(f"| {cat} | {dist} | {g['n']} | {g['correct']} | {g['contrastive']} | "
                     f"{g['both']} | {g['other']} | {g['undecidable']} | {pct(g['accuracy'])} |")
    return "\n".join(lines)


def plot(result: Dict, png: str, title: str = "") -> None:
    """Accuracy by antecedent distance (one bar group per category), or per
    category when the suite gives no distances."""
    accuracy_bar_plot(result, png, title, "generative accuracy (%)")


def write_report(result: Dict, out_dir: str, name: str) -> Dict[str, str]:
    """Table, JSON and PNG, each written whole or not at all."""
    return write_report_files(result, os.path.join(out_dir, f"generative_{name}"),
                              format_result, plot, ensure_ascii=False)


# ------------------------------------------------------------ translations
def _sentence_id(suite: Suite, i: int) -> int:
    """The ``fairseq-generate`` id of example ``i``: its line of the split
    (toy) or its number."""
    return suite.examples[i].corpus_line if suite.context_sentences is None else i


def translations_from_file(suite: Suite, path: str) -> List[str]:
    """Each example's translation from ``fairseq-generate`` output (module
    docstring), checked against the suite's sources."""
    g = read_generate_output(path, need_references=False)
    text = g.detokenized if g.detokenized is not None else g.hypotheses
    by_id = {i: (s, h) for i, s, h in zip(g.ids, g.sources, text)}
    what = ("lines of the binarized split the records point to" if suite.context_sentences is None
            else "example numbers in the suite's order (the file --path writes)")
    out = []
    for i, ex in enumerate(suite.examples):
        sid = _sentence_id(suite, i)
        if sid not in by_id:
            raise ValueError(f"{path}: no translation of sentence id {sid} ({ex.where}); the ids "
                             f"of a {suite.format} suite are {what}")
        src, hyp = by_id[sid]
        want, got = words(ex.source, True), words(src, True)
        if got[len(got) - len(want):] != want or not want:
            raise ValueError(f"{path}: sentence id {sid}: source {src!r} does not end with "
                             f"{ex.where}'s source {ex.source!r}; is it the output for this "
                             "suite (and split)?")
        out.append(hyp)
    return out


def _generation_args(beam: int, max_len_a: float, max_len_b: int, lenpen: float):
    from fairseq.dataclass.configs import GenerationConfig

    g = GenerationConfig()
    g.beam, g.max_len_a, g.max_len_b, g.lenpen = beam, max_len_a, max_len_b, lenpen
    return g


@torch.no_grad()
def translate_suite(scorer: ContrastiveScorer, suite: Suite, beam: int = 5,
                    max_len_a: float = 0.0, max_len_b: int = 200, lenpen: float = 1.0
                    ) -> List[str]:
    """Each example's source translated by beam search in the context of its
    correct candidate, over the scorer's datasets (module docstring); the
    translations are in the model's units with BPE removed."""
    from fairseq import utils

    task, model = scorer.task, scorer.model
    scorer.check_context(suite)
    generator = task.build_generator([model], _generation_args(beam, max_len_a, max_len_b,
                                                                lenpen))
    device = next(model.parameters()).device
    tgt_dict = task.target_dictionary
    out: List[Optional[str]] = [None] * len(suite.examples)
    datasets = scorer.rank_datasets(suite, generation=True)
    for c_rank, (ds, rows) in enumerate(datasets):
        wanted = {int(rows[i]): i for i, ex in enumerate(suite.examples)
                  if ex.correct == c_rank and rows[i] >= 0}
        if not wanted:
            continue
        for b in scorer._batches(ds, np.array(sorted(wanted), dtype=np.int64)):
            sample = ds.collater([ds[int(i)] for i in b])
            ids = sample["id"].tolist()  # the collater's order, read on the host
            # the whole batch on the model's device, as fairseq-generate moves it
            sample = utils.apply_to_sample(lambda t: t.to(device), sample)
            hypos = task.inference_step(generator, [model], sample)
            for row, toks in zip(ids, best_tokens_on_cpu(hypos)):  # one copy per batch
                text = tgt_dict.string(toks)
                for scheme in lines_with_bpe([text]):
                    text = remove_bpe([text], scheme)[0]
                out[wanted[int(row)]] = text
    missing = [suite.examples[i].where for i, h in enumerate(out) if h is None]
    if missing:
        raise RuntimeError(f"{len(missing)} example(s) were not translated, e.g. {missing[0]}; "
                           "refusing to count them")
    return out  # type: ignore[return-value]


def write_translations(suite: Suite, hypotheses: Sequence[str], path: str) -> None:
    """``fairseq-generate``'s format (S-, T- = the correct candidate, H-), ids
    as :func:`translations_from_file` reads them."""
    with open(path + ".partial", "w", encoding="utf-8") as f:
        for i, (ex, h) in enumerate(zip(suite.examples, hypotheses)):
            sid = _sentence_id(suite, i)
            f.write(f"S-{sid}\t{ex.source}\nT-{sid}\t{ex.candidates[ex.correct].target}\n"
                    f"H-{sid}\t0.0\t{h}\n")
    os.replace(path + ".partial", path)


# --------------------------------------------------------------------- API
@dataclass(frozen=True)
class Decoding:
    """The beam search that translates a suite (:func:`translate_suite`;
    ``--beam``, ``--max-len-a``, ``--max-len-b``, ``--lenpen``)."""
    beam: int = 5
    max_len_a: float = 0.0
    max_len_b: int = 200
    lenpen: float = 1.0


def evaluate(contrastive: str, generate_output: Optional[str] = None,
             path: Optional[str] = None, data: Optional[str] = None,
             options: SuiteOptions = SuiteOptions(), decoding: Decoding = Decoding(),
             case_sensitive: bool = False):
    """``(result, suite, hypotheses)`` (module docstring): the translations
    of ``generate_output``, or those of checkpoint ``path`` made here with
    ``decoding``; the suite read and the checkpoint run as ``options`` says."""
    if (generate_output is None) == (path is None):
        raise ValueError("give either --generate-output FILE (translations made already) or "
                         "--path CKPT --data DIR (translate here)")
    if path is not None and data is None:
        raise ValueError("--path needs --data (the binarized data's dictionaries)")
    options.check()
    suite = options.read(contrastive)
    notes: List[str] = []
    if generate_output is not None:
        if options.ablation != "none":
            raise ValueError("--context-ablation is for --path (translate here); the "
                             "translations of --generate-output are made already")
        hyps = translations_from_file(suite, generate_output)
        source = {"generate_output": generate_output}
    else:
        scorer = scorer_for_checkpoint(path, data, options)
        src_enc = scorer.src_enc
        hyps = translate_suite(scorer, suite, decoding.beam, decoding.max_len_a,
                               decoding.max_len_b, decoding.lenpen)
        notes += scorer.notes
        source = {"checkpoint": path, "context_ablation": options.ablation,
                  "beam": decoding.beam, "max_len_a": decoding.max_len_a,
                  "max_len_b": decoding.max_len_b, "lenpen": decoding.lenpen,
                  "context": ("document_translation task context" if scorer.context
                              else "none (sentence-level)")}
        rate = src_enc.unknown_rate()
        if rate is not None and rate > 0.05:
            notes.append(f"{100 * rate:.1f}% of the source tokens are <unk>: is the text in the "
                         "model's units (--tokenizer / --bpe)?")
    result = summarize(suite, hyps, case_sensitive)
    result.update(source)
    result["notes"] = notes
    return result, suite, hyps


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-generative-accuracy",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contrastive", required=True,
                   help="the suite: a file (toy, contrapro, voita) or a prefix (bawden, lopes)")
    p.add_argument("--format", default="toy", choices=FORMATS)
    p.add_argument("--generate-output", default=None, metavar="FILE",
                   help="translations made already (fairseq-generate output; ids: split lines "
                        "for toy, example numbers otherwise)")
    p.add_argument("--path", default=None, help="checkpoint: translate the suite here")
    p.add_argument("--data", default=None, help="with --path: binarized data directory "
                                                "(dictionaries; for --format toy the split)")
    add_suite_args(p, "with --path: translate with wrong context",
                   "toy: models with target context read the references")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--case-sensitive", action="store_true",
                   help="compare words with their case (default: case folded)")
    add_output_args(p, "translate on the GPU")
    return p


def cli_main(argv=None) -> Dict:
    p = get_parser()
    args, options = parse_suite_args(p, argv)
    if args.beam < 1 or args.batch_size < 1:
        p.error("--beam and --batch-size must be >= 1")
    try:
        result, suite, hyps = evaluate(
            args.contrastive, args.generate_output, args.path, args.data, options,
            Decoding(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                     lenpen=args.lenpen), case_sensitive=args.case_sensitive)
    except (OSError, ValueError) as err:
        p.error(str(err))
    name = report_name(args.name, suite.name, args.context_ablation)
    paths = write_report(result, args.out_dir, name)
    if args.path:
        paths["translations"] = os.path.join(args.out_dir, f"generative_{name}.translations.txt")
        write_translations(suite, hyps, paths["translations"])
    print_report(result, paths, format_result, args.json)
    return result


if __name__ == "__main__":
    cli_main(sys.argv[1:])
