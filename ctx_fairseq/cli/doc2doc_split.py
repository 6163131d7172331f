"""``ctx-doc2doc-split``: fairseq-generate output on ``--doc2doc`` segments
split back into one entry per sentence, so that the sentence-level tools
(``ctx-doc-bleu``, the recipes' reports) read it unchanged.

The segments are planned again from the binaries (``{split}.{src}-{tgt}.*``
sizes and ``{split}.docids``) with :func:`ctx_fairseq.data.segments.plan_segments`,
greedily at ``--doc2doc-max-tokens`` (as the task segments every split it
does not train on), so segment ``i`` of the output is mapped to its sentence
ids exactly as the task built it. The options come from the checkpoint
(``--path``: its task's ``doc2doc_max_tokens``, ``doc2doc_separator`` and
language pair) unless given.

Each segment's ``S-``, ``T-``, ``H-`` (and ``D-``) line is split at the
separator (white space around it ignored: SentencePiece's ``--remove-bpe``
glues it to the words). The source and reference must split into the plan's
number of sentences (else the output is not of this data and these options:
an error naming the segment and its document). A hypothesis with another
number of sentences than its source is a *mismatch*: all of them are
reported (how many, which segments), and none is zipped silently: the
per-sentence file is not written and the exit status is 1, unless
``--doc-level-only`` is given, which writes one entry per document (its
segments joined, separators removed) and a ``.docids`` file of one line per
document: ``ctx-doc-bleu OUT --docids OUT.docids`` then scores d-BLEU (its
sentence-level figure is the same, each "sentence" a document).

The per-sentence output is fairseq-generate's format (``S-``/``T-``/``H-``/
``D-`` lines; ids are the corpus sentence ids); a sentence's score is its
segment's. Beside it, ``OUTPUT.segments`` maps each segment to its
sentence ids (one line per segment), for ``ctx-doc-bleu --segments`` (the
per-segment d-BLEU). ``--report FILE`` writes the figures and the
mismatches as JSON.
"""

import argparse
import glob
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ctx_fairseq.data.docids import read_docids
from ctx_fairseq.data.segments import SegmentPlan, document_starts, plan_segments
from ctx_fairseq.errors import InputError
from ctx_fairseq.generate_output import read_generate_output

__all__ = ["split_segments", "language_pair", "split_at", "cli_main"]


def language_pair(data: str, split: str) -> Tuple[str, str]:
    """The one ``{split}.{src}-{tgt}.{src}.idx`` pair of ``data``."""
    pairs = set()
    for path in glob.glob(os.path.join(data, f"{split}.*-*.*.idx")):
        m = re.fullmatch(re.escape(split) + r"\.([^.-]+)-([^.-]+)\.([^.]+)\.idx",
                         os.path.basename(path))
        if m and m.group(3) == m.group(1):
            pairs.add((m.group(1), m.group(2)))
    if len(pairs) != 1:
        raise InputError(f"{data}: {'no' if not pairs else len(pairs)} language pair(s) for "
                         f"split {split!r} ({split}.SRC-TGT.SRC.idx); give --source-lang and "
                         "--target-lang")
    return pairs.pop()


def _sizes(prefix: str) -> Optional[np.ndarray]:
    from fairseq.data import data_utils

    if not os.path.exists(prefix + ".idx"):
        return None
    ds = data_utils.load_indexed_dataset(prefix, None)
    # a copy: the sizes are a view of the file's memory map, closed with its dataset
    return None if ds is None else np.array(ds.sizes, dtype=np.int64, copy=True)


def split_at(text: str, sep: str) -> List[str]:
    """``text`` split at the separator, each piece stripped."""
    return [p.strip() for p in text.split(sep)]


def _scores(path: str) -> Dict[int, str]:
    """The score of the first ``H-`` line of each id."""
    out: Dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                tag, score = line.split("\t", 2)[:2]
                out.setdefault(int(tag[2:]), score)
    return out


def _checked_pieces(what: str, text: str, sep: str, n: int, seg: int, doc: str,
                    path: str) -> List[str]:
    pieces = split_at(text, sep)
    if len(pieces) != n:
        raise InputError(
            f"{path}: the {what} of segment {seg} (document {doc!r}) has {len(pieces)} "
            f"sentence(s), the plan {n}: the output is not of this --data/--split with "
            "these --doc2doc-max-tokens / --doc2doc-separator")
    return pieces


def split_segments(generate_output: str, plan: SegmentPlan, doc_names: Sequence[str],
                   sep: str) -> Dict:
    """The output's segments split into sentences: ``{"sentences": {sid:
    (src, ref, hyp, detok, score)}, "documents": {doc: (src, ref, hyp,
    detok, score)}, "mismatches": [...], "segments": N}`` (module
    docstring). Every segment of the plan must be in the output."""
    out = read_generate_output(generate_output, need_references=False)
    scores = _scores(generate_output)
    ids = set(out.ids)
    missing = [i for i in range(len(plan)) if i not in ids]
    extra = sorted(i for i in ids if not 0 <= i < len(plan))
    if extra:
        raise InputError(f"{generate_output}: segment id {extra[0]} is outside the plan "
                         f"({len(plan)} segments); expected the output of this --data/--split")
    if missing:
        raise InputError(f"{generate_output}: {len(missing)} of {len(plan)} segments have no "
                         f"hypothesis (first: {missing[:5]}); translate the whole split")
    sentences, mismatches = {}, []
    docs: Dict[int, List] = {}
    for row, seg in enumerate(out.ids):
        n, doc = int(plan.counts[seg]), doc_names[int(plan.doc[seg])]
        src = _checked_pieces("source (S- line)", out.sources[row], sep, n, seg, doc,
                              generate_output)
        ref = None
        if out.references is not None:
            ref = _checked_pieces("reference (T- line)", out.references[row], sep, n, seg, doc,
                                  generate_output)
        hyp = split_at(out.hypotheses[row], sep)
        det = split_at(out.detokenized[row], sep) if out.detokenized is not None else None
        d = docs.setdefault(int(plan.doc[seg]), [[], [], [], []])
        d[0] += src
        d[1] += ref or []
        d[2] += [p for p in hyp if p]
        d[3] += [p for p in det if p] if det is not None else []
        if len(hyp) != n or (det is not None and len(det) != n):
            mismatches.append({"segment": seg, "document": doc, "sentences": n,
                               "hypothesis_sentences": len(hyp)})
            continue
        for k, sid in enumerate(plan.sentence_ids(seg)):
            sentences[int(sid)] = (src[k], None if ref is None else ref[k], hyp[k],
                                   None if det is None else det[k], scores.get(seg, "0"))
    documents = {doc_names[d]: tuple(" ".join(x) for x in v) for d, v in sorted(docs.items())}
    return {"sentences": sentences, "documents": documents, "mismatches": mismatches,
            "segments": len(plan), "has_refs": out.references is not None,
            "has_detok": out.detokenized is not None}


def _write_generate(path: str, rows, has_refs: bool, has_detok: bool) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, (src, ref, hyp, det, score) in rows:
            f.write(f"S-{i}\t{src}\n")
            if has_refs:
                f.write(f"T-{i}\t{ref}\n")
            f.write(f"H-{i}\t{score}\t{hyp}\n")
            if has_detok:
                f.write(f"D-{i}\t{score}\t{det}\n")


def _checkpoint_options(path: Optional[str]) -> Dict:
    if not path:
        return {}
    from ctx_fairseq.eval.checkpoints import read_checkpoint

    state = read_checkpoint(path)
    cfg = state.get("cfg") or {}
    task = cfg.get("task") if hasattr(cfg, "get") else None
    if task is None:
        return {}
    return {k: task.get(k, None) for k in ("doc2doc", "doc2doc_max_tokens", "doc2doc_separator",
                                           "source_lang", "target_lang")}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctx-doc2doc-split",
        description="Split fairseq-generate output on --doc2doc segments into one entry per "
                    "sentence (fairseq-generate's format, corpus sentence ids)")
    p.add_argument("generate_output", help="what fairseq-generate printed on the segments")
    p.add_argument("--data", required=True, help="the binarized data directory")
    p.add_argument("--split", default="test", help="the split generated (--gen-subset)")
    p.add_argument("--path", default=None, help="the checkpoint: its task's doc2doc options")
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--doc2doc-max-tokens", type=int, default=None,
                   help="default: the checkpoint's, else 512")
    p.add_argument("--doc2doc-separator", default=None,
                   help="default: the checkpoint's, else <sep>")
    p.add_argument("--output", required=True, help="the per-sentence (or per-document) file")
    p.add_argument("--doc-level-only", action="store_true",
                   help="write one entry per document (and OUTPUT.docids) whatever the "
                        "mismatches, for d-BLEU")
    p.add_argument("--report", default=None, help="write the figures and mismatches as JSON")
    return p


def run(args) -> Tuple[Dict, int]:
    """What the console script does; returns the report and the exit status."""
    ck = _checkpoint_options(args.path)
    if ck and (ck.get("doc2doc") or "none") == "none":
        raise InputError(f"--path {args.path}: the checkpoint was not trained with --doc2doc")
    src_lang = args.source_lang or ck.get("source_lang")
    tgt_lang = args.target_lang or ck.get("target_lang")
    if not (src_lang and tgt_lang):
        src_lang, tgt_lang = language_pair(args.data, args.split)
    max_tokens = args.doc2doc_max_tokens or ck.get("doc2doc_max_tokens") or 512
    sep = args.doc2doc_separator or ck.get("doc2doc_separator") or "<sep>"
    prefix = os.path.join(args.data, f"{args.split}.{src_lang}-{tgt_lang}")
    src = _sizes(f"{prefix}.{src_lang}")
    if src is None:
        raise InputError(f"{prefix}.{src_lang}.idx: not found; expected the binarized split")
    tgt = _sizes(f"{prefix}.{tgt_lang}")
    docids = os.path.join(args.data, f"{args.split}.docids")
    doc_ids = read_docids(docids, expected=len(src))
    plan = plan_segments(src, tgt, doc_ids, "greedy", int(max_tokens))
    names = [doc_ids[int(i)] for i in document_starts(doc_ids)[:-1]]
    res = split_segments(args.generate_output, plan, names, sep)
    mism = res["mismatches"]
    report = {"segments": res["segments"], "sentences": len(src), "documents": len(names),
              "doc2doc_max_tokens": int(max_tokens), "separator": sep,
              "mismatched_segments": len(mism),
              "mismatch_rate": len(mism) / max(res["segments"], 1), "mismatches": mism,
              "output": args.output, "doc_level_only": bool(args.doc_level_only)}
    if args.doc_level_only:
        rows = [(i, (*v, "0")) for i, v in enumerate(res["documents"].values())]
        _write_generate(args.output, rows, res["has_refs"], res["has_detok"])
        with open(args.output + ".docids", "w", encoding="utf-8") as f:
            f.writelines(f"{d}\n" for d in res["documents"])
        status = 0
    elif mism:
        status = 1
    else:
        from ctx_fairseq.eval.scoring.doc_bleu import write_segments

        _write_generate(args.output, sorted(res["sentences"].items()), res["has_refs"],
                        res["has_detok"])
        # the segment map for ctx-doc-bleu --segments (per-segment d-BLEU)
        write_segments(args.output + ".segments", (plan.sentence_ids(i) for i in range(len(plan))))
        report["segments_file"] = args.output + ".segments"
        status = 0
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return report, status


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    """Console script ``ctx-doc2doc-split``; bad input exits with status 2,
    mismatched segments without ``--doc-level-only`` with status 1."""
    p = get_parser()
    args = p.parse_args(argv)
    try:
        report, status = run(args)
    except (OSError, ValueError) as err:
        p.error(str(err))
    n, m = report["segments"], report["mismatched_segments"]
    if m:
        shown = ", ".join(f"{x['segment']} ({x['document']}: {x['hypothesis_sentences']} for "
                          f"{x['sentences']})" for x in report["mismatches"][:10])
        print(f"ctx-doc2doc-split: {m} of {n} segments ({100.0 * m / max(n, 1):.1f}%) have "
              f"another number of sentences than their source: {shown}"
              + (" ..." if m > 10 else ""), file=sys.stderr)
    if status:
        print("ctx-doc2doc-split: no per-sentence output written (s-BLEU would pair "
              "misaligned sentences); --doc-level-only writes one entry per document for "
              "d-BLEU, or generate with --doc2doc-frame", file=sys.stderr)
    else:
        what = "documents" if report["doc_level_only"] else "sentences"
        count = report["documents"] if report["doc_level_only"] else report["sentences"]
        print(f"ctx-doc2doc-split: {n} segments -> {count} {what}: {report['output']}")
    if status:
        sys.exit(status)
    return 0


if __name__ == "__main__":
    cli_main()
