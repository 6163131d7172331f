"""BLEU by source-sentence length (Ampomah et al. 2021, Sec. 7.4, Fig. 5).

Sentences are grouped by the number of whitespace tokens of their ``S-`` line
in ``fairseq-generate`` output, and each group is scored with sacreBLEU
(corpus BLEU of the ``H-`` lines against the ``T-`` lines). The buckets are
half-open, ``[lo, hi)``:

====== ==============
bucket tokens
====== ==============
<10    0-9
10-20  10-19
20-30  20-29
30-40  30-39
40-50  40-49
>50    50 and more
====== ==============

The paper counts *subword* tokens: run ``fairseq-generate`` without
``--remove-bpe`` to get subword ``S-`` lines (otherwise words are counted).
Likewise BLEU is computed on what the ``H-``/``T-`` lines contain.

Command line (``ctx-bleu-by-length``, or ``python -m ctx_fairseq.eval.scoring.bleu_by_length``)::

    ctx-bleu-by-length --system Transformer=gen_base.txt --system Enc-DC=gen_enc.txt \
        --out-dir by_length/

writes ``by_length/bleu_by_length.{md,json,png}`` (systems side by side).
All systems must translate the same sentences (same ids and sources).
"""

import argparse
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.generate_output import corpus_bleu, read_generate_output
from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["BUCKETS", "bucket_of", "bleu_by_length", "write_outputs", "cli_main"]

# (label, lo, hi) with lo <= n < hi
BUCKETS: List[Tuple[str, int, float]] = [
    ("<10", 0, 10), ("10-20", 10, 20), ("20-30", 20, 30),
    ("30-40", 30, 40), ("40-50", 40, 50), (">50", 50, math.inf),
]


def bucket_of(n_tokens: int, buckets=BUCKETS) -> str:
    for label, lo, hi in buckets:
        if lo <= n_tokens < hi:
            return label
    raise ValueError(f"length {n_tokens} falls in no bucket")


def bleu_by_length(systems: Dict[str, str], tokenize: Optional[str] = None,
                   buckets=BUCKETS) -> Dict:
    """``systems``: label -> fairseq-generate output file. Returns a dict with
    ``buckets`` (labels), ``counts`` (sentences per bucket) and ``bleu``
    (system -> bucket -> BLEU, ``None`` for empty buckets) plus ``overall``."""
    if not systems:
        raise ValueError("--system: expected at least one NAME=FILE")
    parsed = {name: read_generate_output(path) for name, path in systems.items()}
    first_name, first = next(iter(parsed.items()))
    src_of = dict(zip(first.ids, first.sources))
    for name, out in parsed.items():
        if set(out.ids) != set(first.ids):
            raise ValueError(f"--system {name}: translates sentence ids that differ from "
                             f"--system {first_name}'s; expected the same test set")
        for i, s in zip(out.ids, out.sources):
            if s != src_of[i]:
                raise ValueError(f"--system {name}: source of sentence {i} differs from "
                                 f"--system {first_name}'s; expected the same test set")
    bucket_ids: Dict[str, List[int]] = {label: [] for label, _, _ in buckets}
    for i, s in src_of.items():
        bucket_ids[bucket_of(len(s.split()), buckets)].append(i)

    result = {"buckets": [b[0] for b in buckets],
              "counts": {b: len(ids) for b, ids in bucket_ids.items()},
              "tokenize": tokenize or "13a", "bleu": {}, "overall": {},
              "files": dict(systems)}
    for name, out in parsed.items():
        hyp = dict(zip(out.ids, out.hypotheses))
        ref = dict(zip(out.ids, out.references))
        result["bleu"][name] = {
            b: (corpus_bleu([hyp[i] for i in ids], [ref[i] for i in ids], tokenize)
                if ids else None)
            for b, ids in bucket_ids.items()
        }
        result["overall"][name] = corpus_bleu(out.hypotheses, out.references, tokenize)
    return result


def format_table(result: Dict) -> str:
    head = ["system"] + [f"{b} (n={result['counts'][b]})" for b in result["buckets"]] + ["all"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, per in result["bleu"].items():
        cells = [name] + ["-" if per[b] is None else f"{per[b]:.2f}" for b in result["buckets"]]
        cells.append(f"{result['overall'][name]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: Dict, png: str) -> None:
    plt = pyplot()
    labels = result["buckets"]
    n_sys = max(1, len(result["bleu"]))
    width = 0.8 / n_sys
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, (name, per) in enumerate(result["bleu"].items()):
        xs = [i + (k - (n_sys - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [per[b] if per[b] is not None else 0.0 for b in labels], width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{b}\n(n={result['counts'][b]})" for b in labels])
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("BLEU")
    ax.set_title("BLEU by source sentence length")
    ax.legend()
    save_figure(fig, png)


def write_outputs(result: Dict, out_dir: str, prefix: str = "bleu_by_length") -> Dict[str, str]:
    markdown = ("# BLEU by source length (sacreBLEU, tokenize=%s)\n\n" % result["tokenize"]
                + format_table(result) + "\n")
    return write_table_files(out_dir, prefix, markdown, result, lambda png: plot(result, png))


def _parse_system(spec: str) -> Tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"ctx-bleu-by-length: error: --system {spec!r}: expected NAME=FILE "
                         f"(a label and a fairseq-generate output file)")
    if not os.path.exists(path):
        raise SystemExit(f"ctx-bleu-by-length: error: --system {spec!r}: no such file {path!r}")
    return name, path


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctx-bleu-by-length",
        description="BLEU by source length bucket (<10, 10-20, ..., >50 tokens) of several "
                    "systems' fairseq-generate outputs, side by side (Ampomah et al. Fig. 5).")
    p.add_argument("--system", action="append", required=True, metavar="NAME=FILE",
                   help="a system label and its fairseq-generate output; repeat per system")
    p.add_argument("--tokenize", default=None,
                   help="sacreBLEU tokenizer (default 13a; 'none' for pre-tokenised text)")
    p.add_argument("--out-dir", default=".", help="where to write the table/JSON/PNG")
    p.add_argument("--prefix", default="bleu_by_length", help="output file name prefix")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    args = get_parser().parse_args(argv)
    systems: Dict[str, str] = {}
    for spec in args.system:
        name, path = _parse_system(spec)
        if name in systems:
            raise SystemExit(f"ctx-bleu-by-length: error: --system {name} given twice; "
                             f"expected unique labels")
        systems[name] = path
    result = bleu_by_length(systems, args.tokenize)
    paths = write_outputs(result, args.out_dir, args.prefix)
    print_written(paths.values(), format_table(result))
    return paths


if __name__ == "__main__":
    cli_main()
