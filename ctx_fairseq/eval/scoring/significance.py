"""Is a BLEU difference between two systems more than chance? Paired bootstrap
resampling (Koehn 2004, *Statistical Significance Tests for Machine
Translation Evaluation*, EMNLP), run by sacreBLEU's own implementation
(``sacrebleu.significance.PairedTest``, ``test_type="bs"``: the same as
``sacrebleu --paired-bs``), not a rewrite of it.

Two tests, both sacreBLEU's, differing only in what a resampled unit is:

``sentences``
    BLEU over the sentences; sacreBLEU draws sentences with replacement
    (``n_samples`` times, its seed ``SACREBLEU_SEED``, default 12345) and
    reports the two-sided p-value of the absolute BLEU difference.
``documents`` (with ``docids``)
    the document-aware test: each document is one segment (its sentences
    joined by a space, in order: d-BLEU, the document-level BLEU of
    Liu et al. 2020 and ``ctx-doc-bleu``), so sacreBLEU draws whole documents
    and sentences of one document move together. The sentences of a
    document are not independent draws (a pronoun chain, a name, a register
    runs through it), so this is the test to report where there are enough
    documents. With fewer than :data:`MIN_DOCUMENTS` documents there is too
    little to resample: no p-value, a note instead.
``segments`` (with ``docids`` and a segment map, ``--segments FILE``)
    the same over the segments of a doc2doc translation (the map
    ``ctx-doc-bleu --segments`` reads, :func:`~ctx_fairseq.eval.scoring.doc_bleu.read_segments`;
    consecutive sentences of one document): each segment one unit, its
    sentences joined (G-Transformer's per-segment d-BLEU, Bao et al. 2021).
    Both systems are cut by the one map, a sentence-level baseline included,
    so the two scores are over the same units; fewer than :data:`MIN_DOCUMENTS`
    segments: no p-value.

``--lowercase`` lower-cases hypotheses and references before every test
(sacreBLEU's ``lowercase``, ``case:lc`` in the signature): Sun et al.'s
(2022) lower-cased d-BLEU is tested with ``--tokenize none --lowercase`` on
tokenized text, as ``ctx-doc-bleu --lowercase`` scores it.

``python -m ctx_fairseq.eval.scoring.significance --baseline B --system S --refs R [R2 ...]
[--docids D [--segments MAP]] [--lowercase] [--generate] [--out JSON]``: ``B``/``S`` plain text (one
hypothesis per line) or, with ``--generate``, ``fairseq-generate`` output (the
``H-`` lines in id order); references one file per reference stream.
"""

import argparse
import collections
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

MIN_DOCUMENTS = 10
N_SAMPLES = 1000

__all__ = ["MIN_DOCUMENTS", "paired_bootstrap", "documents_as_segments", "spans_as_segments",
           "cli_main"]


def _documents(docids: Sequence[str]):
    from ctx_fairseq.eval.scoring.doc_bleu import documents

    return documents(docids)


def documents_as_segments(lines: Sequence[str], docids: Sequence[str]) -> List[str]:
    """One segment per document (contiguous ids), its lines joined by a space."""
    if len(lines) != len(docids):
        raise ValueError(f"{len(lines)} lines but {len(docids)} document ids")
    return spans_as_segments(lines, [(a, k) for _, a, k in _documents(docids)])


def spans_as_segments(lines: Sequence[str], spans: Sequence[Tuple[int, int]]) -> List[str]:
    """One unit per span ``(first line, number of lines)``, its lines joined by a space."""
    return [" ".join(line.strip() for line in lines[a:a + k]) for a, k in spans]


def _paired(base: Sequence[str], system: Sequence[str], refs: Sequence[Sequence[str]],
            tokenize: str, n_samples: int, lowercase: bool = False) -> Dict:
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    test = PairedTest([("baseline", list(base)), ("system", list(system))],
                      metrics={"BLEU": metric}, references=[list(r) for r in refs],
                      test_type="bs", n_samples=n_samples)
    sigs, scores = test()
    bl, sy = scores["BLEU"]
    out = collections.OrderedDict(
        baseline=float(bl.score), system=float(sy.score), delta=float(sy.score - bl.score),
        p_value=float(sy.p_value), system_mean=float(sy.mean), system_ci95=float(sy.ci),
        segments=len(base), signature=str(sigs["BLEU"]))
    if bl.score == sy.score:
        # sacreBLEU counts the resamples whose difference is strictly larger than the
        # observed one: with none observed it reports its smallest p-value, 1/(n+1)
        out["p_value"] = None
        out["note"] = ("identical scores: no difference to test (sacreBLEU's test would "
                       f"report its smallest p-value, {float(sy.p_value):.4g})")
    return out


def _grouped(base, system, references, spans, tokenize, n_samples, lowercase, unit, what):
    b = spans_as_segments(base, spans)
    s = spans_as_segments(system, spans)
    r = [spans_as_segments(x, spans) for x in references]
    out = _paired(b, s, r, tokenize, n_samples, lowercase)
    out["unit"] = unit
    if len(b) < MIN_DOCUMENTS and out["p_value"] is not None:
        out["p_value"] = None
        out["note"] = (f"{len(b)} {what}(s): too few to resample {what}s (at least "
                       f"{MIN_DOCUMENTS}); no {what}-level p-value (the sentence-level "
                       "test treats the sentences of a document as independent: read it "
                       "with that caveat)")
    return out


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str],
                     references: Sequence[Sequence[str]], docids: Optional[Sequence[str]] = None,
                     tokenize: str = "13a", n_samples: int = N_SAMPLES,
                     segments: Optional[Sequence[Tuple[int, int]]] = None,
                     lowercase: bool = False) -> Dict:
    """``{"sentences": ..., "documents": ..., "segments": ...}``: sacreBLEU's
    paired bootstrap of ``system`` against ``baseline`` over sentences, over
    documents (d-BLEU) when ``docids`` are given, and over the ``segments``
    (``(first sentence, number of sentences)`` each, as
    :func:`~ctx_fairseq.eval.scoring.doc_bleu.read_segments` returns them:
    every sentence in exactly one) when they are given; None for a test not
    asked for."""
    n = len(baseline)
    if n == 0:
        raise ValueError("no hypotheses")
    if len(system) != n:
        raise ValueError(f"the baseline has {n} hypotheses, the system {len(system)}")
    if not references:
        raise ValueError("no references")
    for i, r in enumerate(references):
        if len(r) != n:
            raise ValueError(f"reference {i + 1} has {len(r)} lines, the hypotheses {n}")
    if n_samples < 1:
        raise ValueError("--n-samples must be >= 1")
    out = collections.OrderedDict()
    out["test"] = ("paired bootstrap resampling (Koehn 2004), sacreBLEU's PairedTest "
                   f"(test_type bs, {n_samples} resamples, SACREBLEU_SEED "
                   f"{os.environ.get('SACREBLEU_SEED', '12345')}); two-sided p-value of the "
                   "absolute BLEU difference")
    out["lowercase"] = bool(lowercase)
    out["sentences"] = _paired(baseline, system, references, tokenize, n_samples, lowercase)
    out["documents"] = out["segments"] = None
    if docids is not None:
        if len(docids) != n:
            raise ValueError(f"{len(docids)} document ids for {n} hypotheses")
        spans = [(a, k) for _, a, k in _documents(docids)]
        out["documents"] = _grouped(baseline, system, references, spans, tokenize, n_samples,
                                    lowercase, "document (d-BLEU: each document one segment)",
                                    "document")
    if segments is not None:
        covered = sorted(i for a, k in segments for i in range(a, a + k))
        if covered != list(range(n)):
            raise ValueError(f"the segments cover {len(set(covered))} distinct sentence(s) "
                             f"({len(covered)} in all) of {n}: expected every hypothesis in "
                             "exactly one segment")
        out["segments"] = _grouped(baseline, system, references, segments, tokenize,
                                   n_samples, lowercase,
                                   "segment (per-segment d-BLEU, G-Transformer's: each "
                                   "segment's sentences joined)", "segment")
    return out


def _read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _hypotheses(path: str, generate: bool) -> List[str]:
    if not generate:
        return _read_lines(path)
    from ctx_fairseq.generate_output import read_generate_output

    return read_generate_output(path, need_references=False).hypotheses


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-paired-bleu", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="the baseline's hypotheses")
    p.add_argument("--system", required=True, help="the system's hypotheses")
    p.add_argument("--refs", nargs="+", required=True, help="reference files (one per stream)")
    p.add_argument("--docids", default=None,
                   help="document ids, one per line: adds the document-level test")
    p.add_argument("--generate", action="store_true",
                   help="--baseline/--system are fairseq-generate outputs (H- lines)")
    p.add_argument("--segments", default=None, metavar="MAP",
                   help="a doc2doc segment map (ctx-doc-bleu --segments; needs --docids): adds "
                        "the test over segments (per-segment d-BLEU)")
    p.add_argument("--lowercase", "-lc", action="store_true",
                   help="lower-case hypotheses and references first (sacreBLEU's case:lc)")
    p.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer (default: 13a)")
    p.add_argument("--n-samples", type=int, default=N_SAMPLES,
                   help=f"bootstrap resamples (default: {N_SAMPLES})")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    return p


def cli_main(argv=None) -> Dict:
    p = get_parser()
    args = p.parse_args(argv)
    try:
        base = _hypotheses(args.baseline, args.generate)
        system = _hypotheses(args.system, args.generate)
        refs = [_read_lines(r) for r in args.refs]
        docids = _read_lines(args.docids) if args.docids else None
        spans = None
        if args.segments is not None:
            from ctx_fairseq.eval.scoring.doc_bleu import read_segments

            if docids is None:
                raise ValueError(f"--segments {args.segments} needs --docids (a segment lies "
                                 "within one document; the map is checked against them)")
            if len(docids) != len(base):
                raise ValueError(f"{len(docids)} document ids for {len(base)} hypotheses")
            spans = read_segments(args.segments, docids)
        result = paired_bootstrap(base, system, refs, docids, args.tokenize, args.n_samples,
                                  spans, args.lowercase)
        result["baseline_file"], result["system_file"] = args.baseline, args.system
        if args.out:  # whole or not at all
            d = os.path.dirname(os.path.abspath(args.out))
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".paired-", dir=d)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
            os.replace(tmp, args.out)
    except (OSError, ValueError) as err:
        p.error(str(err))
    s, d, g = result["sentences"], result["documents"], result["segments"]
    ps = "n/a (identical scores)" if s["p_value"] is None else f"{s['p_value']:.4f}"
    if result["lowercase"]:
        print("lower-cased (case:lc): every score below")
    print(f"BLEU baseline {s['baseline']:.2f}, system {s['system']:.2f} "
          f"(delta {s['delta']:+.2f}), paired bootstrap over {s['segments']} sentences: "
          f"p = {ps}")
    if d is not None:
        pv = "n/a (" + d.get("note", "").split(":")[0] + ")" if d["p_value"] is None \
            else f"{d['p_value']:.4f}"
        print(f"d-BLEU baseline {d['baseline']:.2f}, system {d['system']:.2f} "
              f"(delta {d['delta']:+.2f}), over {d['segments']} documents: p = {pv}")
    if g is not None:
        pv = "n/a (" + g.get("note", "").split(":")[0] + ")" if g["p_value"] is None \
            else f"{g['p_value']:.4f}"
        print(f"segment d-BLEU baseline {g['baseline']:.2f}, system {g['system']:.2f} "
              f"(delta {g['delta']:+.2f}), over {g['segments']} segments: p = {pv}")
    return result


if __name__ == "__main__":
    cli_main(sys.argv[1:])
