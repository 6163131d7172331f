"""The report of the contrastive tools (the scorer, ``ctx-score-contrastive``,
and generative accuracy, ``ctx-generative-accuracy``): their accuracies
grouped by category and antecedent distance, the rows of their tables, their
bar plot and the writer of their three files. Each tool keeps its own
outcomes, summary of a group and columns; what they share is here."""

import argparse
import collections
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.data.conditions import ABLATIONS
from ctx_fairseq.eval.scoring.contrastive_suites import Suite, read_suite
from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure

__all__ = ["distance_key", "group_outcomes", "pct", "result_rows", "accuracy_bar_plot",
           "write_report_files", "add_suite_args", "suite_langs", "SuiteOptions", "suite_options",
           "parse_suite_args", "report_name",
           "print_report", "add_output_args"]


def distance_key(d: str):
    """Sort key of an antecedent distance: the numbers in order, then any
    other label (e.g. ``5+``) by name."""
    try:
        return (0, int(d), "")
    except ValueError:
        return (1, 0, d)


def group_outcomes(suite, outcomes: Sequence[str],
                   group: Callable[[Sequence[str]], Dict]) -> Dict:
    """The outcomes of ``suite``'s examples (one each, in order) summarised
    by ``group``: ``overall``; ``by_phenomenon`` (each category, in the
    order of its first example); ``by_distance`` (each category with
    distances, then each distance) and ``by_distance_overall`` (each
    distance of all examples), distances in :func:`distance_key` order."""
    cats = collections.OrderedDict()
    for ex, o in zip(suite.examples, outcomes):
        cats.setdefault(ex.category, []).append((ex.distance, o))
    result = {"overall": group(outcomes), "by_phenomenon": {}, "by_distance": {},
              "by_distance_overall": {}}
    for cat, items in cats.items():
        result["by_phenomenon"][cat] = group([o for _, o in items])
        dists = sorted({d for d, _ in items if d is not None}, key=distance_key)
        if dists:
            result["by_distance"][cat] = {d: group([o for dd, o in items if dd == d])
                                          for d in dists}
    for d in sorted({ex.distance for ex in suite.examples if ex.distance is not None},
                    key=distance_key):
        result["by_distance_overall"][d] = group(
            [o for ex, o in zip(suite.examples, outcomes) if ex.distance == d])
    return result


def pct(x) -> str:
    """An accuracy (0..1, None for no example) in percent for a table."""
    return "-" if x is None else f"{100 * x:.1f}"


def result_rows(result: Dict) -> List[Tuple[str, str, Dict]]:
    """``(category, distance, group)`` rows of a summary, in table order: all
    examples; all by antecedent distance; then each category (when there
    are several, or no distances) and, with several categories, each by
    distance."""
    rows = [("all", "all", result["overall"])]
    by_distance = result.get("by_distance_overall") or {}
    rows += [("all", d, g) for d, g in by_distance.items()]
    several = len(result["by_phenomenon"]) > 1
    for cat, g in result["by_phenomenon"].items():
        if several or not by_distance:
            rows.append((cat, "all", g))
        if several:
            rows += [(cat, d, gd) for d, gd in result["by_distance"].get(cat, {}).items()]
    return rows


def accuracy_bar_plot(result: Dict, png: str, title: str, ylabel: str,
                      ties: bool = False) -> None:
    """Accuracy by antecedent distance (a bar group for all examples, and
    one per category when there are several), or per category when the
    suite gives no distances; ``ties``: the tied share stacked, hatched, on
    each bar (the scorer's)."""
    import numpy as np

    plt = pyplot()
    if result.get("by_distance_overall"):
        groups = [("all", result["by_distance_overall"])]
        if len(result["by_phenomenon"]) > 1:
            groups += list(result["by_distance"].items())
    else:
        groups = [("all", dict(result["by_phenomenon"]))]
    keys: List[str] = []
    for _, d in groups:
        keys += [k for k in d if k not in keys]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(keys) + 2), 3.5))
    width = 0.8 / len(groups)
    x = np.arange(len(keys))
    for j, (name, d) in enumerate(groups):
        acc = [100 * (d[k]["accuracy"] or 0) if k in d else 0 for k in keys]
        tied = [100 * d[k]["ties"] / d[k]["n"] if ties and k in d and d[k]["n"] else 0
                for k in keys]
        ax.bar(x + j * width, acc, width, label=f"{name} correct" if ties else name)
        if any(tied):
            ax.bar(x + j * width, tied, width, bottom=acc, hatch="//", alpha=0.4,
                   label=f"{name} ties")
    ax.set_xticks(x + width * (len(groups) - 1) / 2)
    ax.set_xticklabels(keys)
    ax.set_xlabel("antecedent distance (sentences)" if result.get("by_distance_overall")
                  else "category")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.set_title(title or os.path.basename(result["suite"]))
    ax.legend(fontsize=7)
    save_figure(fig, png)


def write_report_files(result: Dict, prefix: str, format_fn: Callable[[Dict], str],
                       plot_fn: Callable[[Dict, str], None],
                       ensure_ascii: bool = True) -> Dict[str, str]:
    """``PREFIX.md`` (``format_fn(result)``), ``PREFIX.json`` and ``PREFIX.png``
    (``plot_fn(result, path)``), each written whole or not at all; returns
    their paths."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    paths = {ext: f"{prefix}.{ext}" for ext in ("md", "json", "png")}
    tmp = {ext: p + ".partial" for ext, p in paths.items()}
    try:
        with open(tmp["md"], "w", encoding="utf-8") as f:
            f.write(format_fn(result) + "\n")
        with open(tmp["json"], "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, ensure_ascii=ensure_ascii)
        plot_fn(result, tmp["png"] + ".png")
        os.replace(tmp["png"] + ".png", tmp["png"])
        for ext in paths:
            os.replace(tmp[ext], paths[ext])
    finally:
        for p in list(tmp.values()) + [tmp["png"] + ".png"]:
            if os.path.exists(p):
                os.remove(p)
    return paths


def add_suite_args(p, ablation_help: str, target_context_help: str) -> None:
    """The suite options both tools take (after ``--contrastive`` and
    ``--format``): the public suites' file suffixes, context and JSON, the
    toy split, the context ablation, target context from the references and
    partial documents."""
    p.add_argument("--suite-langs", default=None, metavar="SRC-TGT",
                   help="file suffixes for contrapro (default en-de) and bawden (en-fr)")
    p.add_argument("--suite-context", type=int, default=None, metavar="N",
                   help="lopes: read PREFIX.cN.context.{src,trg}")
    p.add_argument("--suite-json", default=None,
                   help="lopes: the suite's JSON, for categories and distances")
    p.add_argument("--split", default="test", help="toy: the split the records' ids refer to")
    p.add_argument("--context-ablation", default="none", choices=list(ABLATIONS),
                   help=ablation_help)
    p.add_argument("--gold-target-context", action="store_true", help=target_context_help)
    p.add_argument("--allow-partial-document", action="store_true",
                   help="whole-document models (--document-context online) on a public suite: "
                        "use the few previous sentences the suite gives (reported)")


def suite_langs(parser, value: Optional[str]) -> Optional[Tuple[str, str]]:
    """``--suite-langs SRC-TGT`` as a pair (None if not given); a parser
    error otherwise."""
    if not value:
        return None
    parts = value.split("-")
    if len(parts) != 2 or not all(parts):
        parser.error(f"--suite-langs {value}: expected SRC-TGT, e.g. en-de")
    return parts[0], parts[1]


@dataclass(frozen=True)
class SuiteOptions:
    """What both tools' evaluations take besides the suite's path and the
    checkpoint: the suite's format (``fmt``, :data:`FORMATS`) and its options
    (``langs``: contrapro and bawden's file suffixes; ``suite_context`` /
    ``suite_json``: lopes), the toy ``split``, the context ``ablation``,
    ``gold_target_context``, ``allow_partial_document``, the device (``cpu``),
    the text units (``text_args``, ``--tokenizer`` / ``--bpe`` ...; the
    defaults when None) and the batches (``batch_size``, ``max_tokens``). One
    object, so that a new suite option reaches both tools through
    :func:`suite_options` without a new parameter in each."""
    fmt: str = "toy"
    langs: Optional[Tuple[str, str]] = None
    suite_context: Optional[int] = None
    suite_json: Optional[str] = None
    split: str = "test"
    ablation: str = "none"
    gold_target_context: bool = False
    allow_partial_document: bool = False
    cpu: bool = True
    text_args: Optional[argparse.Namespace] = None
    batch_size: int = 32
    max_tokens: Optional[int] = None

    def check(self, toy_only_note: str = "") -> None:
        """A ``ValueError`` for an option the format does not take
        (``toy_only_note``: what the toy-only options' error adds)."""
        if self.fmt != "lopes" and (self.suite_context is not None or self.suite_json is not None):
            raise ValueError("--suite-context and --suite-json are for --format lopes")
        if self.fmt not in ("contrapro", "bawden") and self.langs is not None:
            raise ValueError("--suite-langs is for --format contrapro and bawden")
        if self.fmt != "toy" and (self.gold_target_context or self.split != "test"):
            raise ValueError("--gold-target-context and --split are for --format toy"
                             + toy_only_note)

    def read(self, contrastive: str) -> Suite:
        """The suite at ``contrastive`` (a file or a prefix) in this format."""
        return read_suite(self.fmt, contrastive, langs=self.langs, context=self.suite_context,
                          meta=self.suite_json)


def suite_options(parser, args) -> SuiteOptions:
    """Both tools' :class:`SuiteOptions` from their options (``--format``,
    ``--batch-size``, ``--max-tokens`` and those of :func:`add_suite_args` and
    :func:`add_output_args`; ``--suite-langs`` checked by
    :func:`suite_langs`: a parser error)."""
    return SuiteOptions(fmt=args.format, cpu=not args.cuda, ablation=args.context_ablation,
                        split=args.split, gold_target_context=args.gold_target_context,
                        text_args=args, langs=suite_langs(parser, args.suite_langs),
                        suite_context=args.suite_context, suite_json=args.suite_json,
                        allow_partial_document=args.allow_partial_document,
                        batch_size=args.batch_size, max_tokens=args.max_tokens)


def parse_suite_args(parser, argv) -> Tuple[argparse.Namespace, SuiteOptions]:
    """``(args, options)``: either tool's command line ``argv`` parsed by its
    ``parser`` and the :class:`SuiteOptions` it gives (:func:`suite_options`)."""
    args = parser.parse_args(argv)
    return args, suite_options(parser, args)


def report_name(name: Optional[str], suite_name: str, ablation: str) -> str:
    """The outputs' file name part: ``--name``, else the suite's name with
    the ablation appended (``_shuffled``)."""
    if name:
        return name
    return suite_name + (f"_{ablation}" if ablation != "none" else "")


def print_report(result: Dict, paths: Dict[str, str], format_fn: Callable[[Dict], str],
                 as_json: bool) -> None:
    """The summary (without the per-example records) as JSON, or the table
    and the files written."""
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))
    else:
        print_written(paths.values(), format_fn(result), one_line=True)


def add_output_args(p, device_help: str) -> None:
    """The options both tools end with: where the report goes, its name,
    JSON instead of the table, the GPU, and the text units of the suite
    (:func:`ctx_fairseq.eval.text_units.add_text_unit_args`)."""
    from ctx_fairseq.eval.text_units import add_text_unit_args

    p.add_argument("--out-dir", default=".", help="where the table/JSON/PNG go")
    p.add_argument("--name", default=None,
                   help="file name part of the outputs (default: the suite's name)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--cuda", action="store_true", help=device_help)
    add_text_unit_args(p)
