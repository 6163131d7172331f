"""Document-level BLEU of ``fairseq-generate`` output (``ctx-doc-bleu``).

Reads what ``fairseq-generate`` printed (the ``S-``/``T-``/``H-``/``D-``
lines; hypotheses are put back in corpus order by their ids) and the
``{split}.docids`` file of the generated split (one document id per sentence,
documents contiguous), and scores with sacreBLEU (``sacrebleu.metrics.BLEU``):

* **sentence-level BLEU** (s-BLEU): corpus BLEU over the sentences (the
  usual score);
* **document-level BLEU** (d-BLEU per document): per document, the hypotheses of its sentences
  joined with spaces and the references likewise; corpus BLEU over the
  documents, each document one segment. Corpus BLEU sums n-gram counts and
  lengths over the segments, so it differs from the sentence-level score
  through the n-grams that cross sentence boundaries and through matches
  clipped per document instead of per sentence (joining adds no tokens: the
  lengths, hence the brevity penalty, stay the same);
* **segment-level BLEU** (``--segments FILE``, G-Transformer's d-BLEU): per
  segment of the map (consecutive sentences of one document, e.g. the
  ``--doc2doc`` segments a model translated at once), its hypotheses joined
  and its references likewise; corpus BLEU over the segments. Any model's
  output can be scored on the same map (a sentence-level model's too);
* the BLEU of each document on its own (same settings), for the table and plot.

Every model gets the same figures: a sentence-level model's sentences are
joined per document (and per segment) exactly as a document model's are, once
its segment output is split back into one line per sentence id
(``ctx-doc2doc-split``).

Each score is printed with sacreBLEU's signature and what it computes
(``computes:``; the JSON's ``computes``), the number of sentences, documents
and segments, which hypothesis lines were scored against which references,
and what kind of BLEU that is (``metric:``; also on each score line).

Hypotheses (``--hypotheses``): fairseq-generate prints ``H-`` (the hypothesis
in the binarized data's tokenization, BPE removed if it ran with
``--remove-bpe``/``--post-process``; not detokenized) and ``D-`` (the same
passed through its ``--bpe`` and ``--tokenizer`` decoders: the detokenized
hypothesis; identical to ``H-`` when it ran without them). A post-processing
step may have replaced the ``D-`` lines (``ctx-prep-corpora
postprocess-generate``: detruecased and detokenized ``H-`` lines); they are
scored as the file holds them. fairseq-generate decodes the ``T-`` references
like the ``D-`` lines, so the default (``auto``) scores the ``D-`` lines, and
the ``H-`` lines only for a file without ``D-`` lines; ``--hypotheses H``
forces the ``H-`` lines (with a warning where they differ from the ``D-``
lines and are scored against the ``T-`` lines, or by a sacreBLEU tokenizer).

References: the ``T-`` lines, or ``--refs FILE`` (one line per sentence of the
split in corpus order, scored as given: detokenized text for sacreBLEU, text
tokenized like the ``H-`` lines for tokenized BLEU; then the output needs no
``T-`` lines).

Metric (``--tokenize``): with a sacreBLEU tokenizer (default ``13a``) the
score is **sacreBLEU**, meant for detokenized hypotheses and references
(sacreBLEU tokenizes both itself); with ``--tokenize none`` it is BLEU over
the words of the text as given: **tokenized BLEU** (multi-bleu.perl's
computation) when the hypotheses are the ``H-`` lines or ``D-`` lines equal
to them, which depends on the tokenization and is not comparable with
sacreBLEU; on detokenized ``D-`` lines ``--tokenize none`` is neither (a
warning). ``--lowercase`` lower-cases hypotheses and references first
(sacreBLEU's ``lowercase``, ``case:lc`` in the signature); with ``--tokenize
none`` over tokenized text that is **lower-cased tokenized BLEU**, Sun et al.
2022's s-BLEU and d-BLEU (Moses' multi-bleu.perl ``-lc`` over tokenized
text, one line per sentence or per document).

Segment map (``--segments FILE``, :func:`read_segments`, written by
:func:`write_segments`): one line per segment, the corpus sentence ids of the
segment (0-based ids of the split), space-separated, ascending and
consecutive, all in one document of ``--docids``; every sentence in exactly
one segment.

BPE: text still holding BPE units (subword-nmt ``@@ `` continuation markers or
SentencePiece ``\u2581`` markers) is never scored: that is an error, unless
``--remove-bpe [subword_nmt|sentencepiece]`` is given, which applies
fairseq's own ``--remove-bpe`` step to the ``H-``/``D-``/``T-`` lines (not to
``--refs``, which must be plain text).

Checks (each an error naming the file): every sentence of the split (one per
line of the docids file) must have a hypothesis (missing ids are listed, e.g.
generation on a subset or long sentences skipped), no id may lie outside the
split, no id may occur twice, ``--refs`` must have one line per sentence, and
empty inputs are refused.

Command line (``ctx-doc-bleu``, or ``python -m ctx_fairseq.eval.scoring.doc_bleu``)::

    fairseq-generate data-bin --path ckpt.pt --gen-subset test --remove-bpe > gen.txt
    ctx-doc-bleu gen.txt --docids data-bin/test.docids --out-dir doc_bleu/

writes ``doc_bleu/doc_bleu.{md,json,png}`` (the scores and a table of BLEU per
document; the JSON; BLEU per document and its histogram) and prints the
scores. See ``docs/doc_bleu.md``.
"""

import argparse
import os
from itertools import groupby
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.generate_output import (BPE_SCHEMES, bleu_metric, lines_with_bpe,
                                              read_generate_output, remove_bpe)
from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["DocBleuError", "read_references", "documents", "read_segments", "write_segments",
           "doc_bleu", "format_report",
           "format_documents", "plot", "write_outputs", "get_parser", "cli_main"]

PROG = "ctx-doc-bleu"
HYPOTHESES = ("auto", "D", "H")


class DocBleuError(ValueError):
    """Inputs that cannot be scored (the message names the file)."""


def _ids_text(ids: Sequence[int], limit: int = 20) -> str:
    """``[3, 4, 5, 9]`` -> ``'3-5, 9'`` (at most ``limit`` ranges)."""
    ranges: List[Tuple[int, int]] = []
    for i in ids:
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    return ", ".join(parts) + (", ..." if len(ranges) > limit else "")


def read_references(path: str) -> List[str]:
    """One reference per line (UTF-8, a byte-order mark dropped); only line
    feeds end a line."""
    if not os.path.isfile(path):
        raise DocBleuError(f"--refs {path}: no such file")
    with open(path, encoding="utf-8-sig", newline="\n") as f:
        lines = [line[:-1] if line.endswith("\n") else line for line in f]
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if not lines:
        raise DocBleuError(f"--refs {path}: empty file; expected one reference per sentence")
    return lines


def documents(docids: Sequence[str]) -> List[Tuple[str, int, int]]:
    """``(docid, first line, number of lines)`` of each (contiguous) document."""
    out, start = [], 0
    for docid, group in groupby(docids):
        n = sum(1 for _ in group)
        out.append((docid, start, n))
        start += n
    return out


def write_segments(path: str, segments) -> None:
    """Write a segment map (module docstring): one line per segment of
    ``segments`` (iterables of sentence ids)."""
    with open(path, "w", encoding="utf-8") as f:
        for ids in segments:
            f.write(" ".join(str(int(i)) for i in ids) + "\n")


def _segment_line(path: str, lineno: int, line: str, doc_of: Sequence[str]) -> Tuple[int, int]:
    where = f"--segments {path}, line {lineno}"
    try:
        ids = [int(t) for t in line.split()]
    except ValueError:
        raise DocBleuError(f"{where}: {line.strip()[:60]!r}: expected the sentence ids of one "
                           f"segment (integers separated by spaces)") from None
    if not ids:
        raise DocBleuError(f"{where}: empty; expected the sentence ids of one segment")
    n = len(doc_of)
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise DocBleuError(f"{where}: ids {_ids_text(ids, 5)} are not ascending and consecutive "
                           f"(a segment is consecutive sentences)")
    if ids[0] < 0 or ids[-1] >= n:
        raise DocBleuError(f"{where}: ids {_ids_text(ids, 5)} lie outside the split (0..{n - 1} "
                           f"by the docids file)")
    if doc_of[ids[0]] != doc_of[ids[-1]]:
        raise DocBleuError(f"{where}: the segment {_ids_text(ids, 5)} crosses documents "
                           f"{doc_of[ids[0]]!r} and {doc_of[ids[-1]]!r} of the docids file")
    return ids[0], len(ids)


def read_segments(path: str, doc_of: Sequence[str]) -> List[Tuple[int, int]]:
    """``(first sentence id, number of sentences)`` of each segment of the map
    ``path`` (module docstring), checked against the split's document ids
    ``doc_of`` (one per sentence)."""
    if not os.path.isfile(path):
        raise DocBleuError(f"--segments {path}: no such file")
    with open(path, encoding="utf-8-sig") as f:
        segs = [_segment_line(path, k, line, doc_of) for k, line in enumerate(f, 1)]
    if not segs:
        raise DocBleuError(f"--segments {path}: empty file; expected one line per segment")
    covered = [0] * len(doc_of)
    for start, k in segs:
        for i in range(start, start + k):
            covered[i] += 1
    twice = [i for i, c in enumerate(covered) if c > 1]
    missing = [i for i, c in enumerate(covered) if c == 0]
    if twice or missing:
        parts = []
        if twice:
            parts.append(f"{len(twice)} sentence(s) in two segments: ids {_ids_text(twice)}")
        if missing:
            parts.append(f"{len(missing)} sentence(s) in none: ids {_ids_text(missing)}")
        raise DocBleuError(f"--segments {path}: {'; '.join(parts)}; expected every sentence of "
                           f"the split ({len(doc_of)} by the docids file) in exactly one segment")
    return segs


#: what the lines of fairseq-generate output hold (for the report)
_H_LINES = ("fairseq-generate's hypotheses in the binarized data's tokenization (BPE removed "
            "if it ran with --remove-bpe), not detokenized")
_D_LINES = ("fairseq-generate's detokenized hypotheses (the H- lines through its --bpe and "
            "--tokenizer decoders), or what a post-processing step wrote in their place")


def _choose_hypotheses(gen, path: str, which: str, refs_given: bool,
                       tokenize: str) -> Tuple[List[str], Dict, List[str]]:
    if which not in HYPOTHESES:
        raise DocBleuError(f"--hypotheses {which}: expected one of {', '.join(HYPOTHESES)}")
    has_d = gen.detokenized is not None
    differ = (sum(h != d for h, d in zip(gen.hypotheses, gen.detokenized)) if has_d else None)
    n = len(gen.hypotheses)
    if which == "D" and not has_d:
        raise DocBleuError(f"{path}: no D- lines (detokenized hypotheses); score the H- lines "
                           f"with --hypotheses H")
    lines = "D" if which == "D" or (which == "auto" and has_d) else "H"
    warnings = []
    if lines == "D":
        text = (f"D- lines of {path}: identical to the H- lines (fairseq-generate decoded "
                f"nothing: no --tokenizer or --bpe), i.e. the text in the binarized data's "
                f"tokenization" if not differ else
                f"D- lines of {path}: {_D_LINES}; they differ from the H- lines in {differ} of "
                f"{n} sentences")
    elif not has_d:
        text = f"H- lines of {path}: {_H_LINES} (the file has no D- lines)"
    elif not differ:
        text = f"H- lines of {path}: {_H_LINES}; identical to the D- lines"
    else:
        text = (f"H- lines of {path}: {_H_LINES}; they differ from the D- lines in {differ} "
                f"of {n} sentences")
        if not refs_given:
            warnings.append("the H- lines are tokenized text but the T- references are "
                            "decoded like the D- lines: the default scores the D- lines")
        elif tokenize != "none":
            warnings.append(f"sacreBLEU (tok:{tokenize}) of the tokenized H- lines: sacreBLEU "
                            f"expects detokenized text (the D- lines); for tokenized BLEU give "
                            f"--tokenize none and references tokenized like the H- lines")
    if lines == "D" and differ and tokenize == "none":
        warnings.append("--tokenize none on the detokenized D- lines (words keep their "
                        "punctuation attached): neither sacreBLEU's standard score nor "
                        "tokenized BLEU")
    return (gen.detokenized if lines == "D" else gen.hypotheses), {
        "lines": lines, "description": text, "differ_from_H": differ}, warnings


def _metric(tokenize: str, lines: str, differ: Optional[int], refs_given: bool,
            lowercase: bool = False) -> Dict:
    """What kind of BLEU the scores are, for the report (``kind`` is short)."""
    info = _metric_cased(tokenize, lines, differ, refs_given)
    if not lowercase:
        return info
    label = info["label"].replace(f"tok:{tokenize}", f"tok:{tokenize}, case:lc", 1)
    sun = (" (Sun et al. 2022's s-BLEU and d-BLEU: multi-bleu.perl -lc over tokenized text)"
           if info["kind"] == "tokenized BLEU" else "")
    return {"kind": "lower-cased " + info["kind"], "label": "lower-cased " + label,
            "description": f"lower-cased {info['kind']}{sun}: hypotheses and references "
                           f"lower-cased before scoring (--lowercase, sacreBLEU's case:lc), "
                           f"then {info['description']}"}


def _metric_cased(tokenize: str, lines: str, differ: Optional[int], refs_given: bool) -> Dict:
    refs = "--refs" if refs_given else "T- lines"
    if tokenize != "none":
        return {"kind": "sacreBLEU",
                "label": f"sacreBLEU tok:{tokenize}, {lines}- lines vs {refs}",
                "description": f"sacreBLEU with its {tokenize} tokenizer: sacreBLEU tokenizes "
                               f"hypotheses and references itself, so both should be "
                               f"detokenized text (the standard score; its signature makes it "
                               f"comparable)"}
    if lines == "H" or not differ:
        return {"kind": "tokenized BLEU",
                "label": f"tokenized BLEU, tok:none, {lines}- lines vs {refs}",
                "description": "tokenized BLEU: sacreBLEU --tokenize none, the words of "
                               "hypotheses and references split at spaces as the files hold "
                               "them (multi-bleu.perl's computation); it depends on their "
                               "tokenization (the references must be tokenized like the "
                               "hypotheses) and is not comparable with sacreBLEU (13a) scores"}
    return {"kind": "BLEU of detokenized text, tok:none",
            "label": f"tok:none on detokenized text, {lines}- lines vs {refs}",
            "description": "sacreBLEU --tokenize none over detokenized D- lines: the words as "
                           "split at spaces, punctuation attached; neither tokenized BLEU nor "
                           "sacreBLEU's standard score"}


def _check_bpe(lines: Sequence[str], what: str, ids: Sequence[int], hint: str) -> None:
    found = lines_with_bpe(lines)
    if found:
        scheme, idx = next(iter(found.items()))
        marker = "'@@ '" if scheme == "subword_nmt" else "'\u2581'"
        raise DocBleuError(
            f"{what}: {len(idx)} of {len(lines)} sentences still hold {scheme} BPE markers "
            f"({marker}), e.g. sentence {ids[idx[0]]}: {lines[idx[0]]!r}; BLEU over BPE units "
            f"is not word BLEU: {hint}")


def _check_ids(generate_output: str, docids: str, ids: Sequence[int], n: int) -> None:
    if ids == list(range(n)):
        return
    missing = sorted(set(range(n)) - set(ids))
    outside = [i for i in ids if not 0 <= i < n]
    parts = []
    if missing:
        parts.append(f"{len(missing)} sentence(s) of the split have no hypothesis: ids "
                     f"{_ids_text(missing)}; expected fairseq-generate output over the whole "
                     f"split (not a subset or a run cut short; long sentences skipped by "
                     f"--skip-invalid-size-inputs-valid-test or --max-positions also go "
                     f"missing)")
    if outside:
        parts.append(f"{len(outside)} id(s) lie outside the split (0..{n - 1}): "
                     f"{_ids_text(outside)}; is {docids} the docids file of the split "
                     f"that was generated?")
    raise DocBleuError(f"{generate_output}: hypotheses for {len(ids)} sentences, but "
                       f"{docids} has {n} document ids (one per sentence of the split); "
                       + "; ".join(parts))


#: what each score computes (the JSON's ``computes``; the report's names)
COMPUTES = {
    "sentence_level": "s-BLEU: corpus BLEU over the sentences of the split",
    "document_level": "d-BLEU per document: corpus BLEU over the documents of --docids, each "
                      "document's hypotheses joined with spaces and its references likewise",
    "segment_level": "d-BLEU per segment (G-Transformer's): corpus BLEU over the segments of "
                     "--segments, each segment's hypotheses joined with spaces and its "
                     "references likewise",
}


def _bleu(tokenize: Optional[str], lowercase: bool):
    from sacrebleu.metrics import BLEU

    bleu_metric(tokenize)  # an unknown tokenizer: its error
    return BLEU(tokenize=tokenize, lowercase=lowercase)


def _score(hyps: Sequence[str], refs: Sequence[str], spans: Sequence[Tuple[int, int]],
           tokenize: Optional[str], lowercase: bool, key: str) -> Dict:
    """Corpus BLEU over ``spans`` (first line, number of lines), each span's
    lines joined with spaces (one line each: the sentences themselves)."""
    m = _bleu(tokenize, lowercase)
    joined_h = [" ".join(hyps[a:a + k]) for a, k in spans]
    joined_r = [" ".join(refs[a:a + k]) for a, k in spans]
    s = m.corpus_score(joined_h, [joined_r])
    return {"bleu": s.score, "segments": len(spans), "computes": COMPUTES[key],
            "sacrebleu": str(s), "signature": str(m.get_signature()),
            "precisions": list(s.precisions), "bp": s.bp, "hyp_len": s.sys_len,
            "ref_len": s.ref_len}


def _references(gen, generate_output: str, refs: Optional[str], docids: str,
                n: int) -> Tuple[List[str], str]:
    if refs is None:
        return gen.references, (f"T- lines of {generate_output}: fairseq-generate's references "
                                f"(the binarized target, decoded like the D- lines)")
    references = read_references(refs)
    if len(references) != n:
        raise DocBleuError(f"--refs {refs}: {len(references)} lines, but {docids} has {n} "
                           f"document ids; expected one reference per sentence of the split")
    return references, f"--refs {refs} (one per sentence, scored as the file holds them)"


def _without_bpe(hyps, references, scheme, refs_given: bool, what: str, generate_output: str,
                 refs: Optional[str], ids) -> Tuple[List[str], List[str], Optional[Dict]]:
    removed = None
    if scheme is not None:
        new_hyps = remove_bpe(hyps, scheme)
        new_refs = references if refs_given else remove_bpe(references, scheme)
        removed = {"scheme": scheme,
                   "hypotheses_changed": sum(a != b for a, b in zip(hyps, new_hyps)),
                   "references_changed": sum(a != b for a, b in zip(references, new_refs))}
        hyps, references = new_hyps, new_refs
    hint = ("run fairseq-generate with --remove-bpe, or give --remove-bpe here"
            if scheme is None else
            f"they remain after --remove-bpe {scheme}: is it the right scheme?")
    _check_bpe(hyps, what, ids, hint)
    if not refs_given:
        _check_bpe(references, f"{generate_output} (T- lines)", ids, hint)
    else:
        _check_bpe(references, f"--refs {refs}", ids,
                   "expected plain (detokenized) reference text")
    return hyps, references, removed


def doc_bleu(generate_output: str, docids: str, refs: Optional[str] = None,
             hypotheses: str = "auto", remove_bpe_scheme: Optional[str] = None,
             tokenize: Optional[str] = None, lowercase: bool = False,
             segments: Optional[str] = None) -> Dict:
    """Score ``generate_output`` per sentence, per document and (``segments``)
    per segment (module docstring); returns the result dict that
    :func:`write_outputs` saves."""
    from ctx_fairseq.data.docids import read_docids

    if not os.path.isfile(generate_output):
        raise DocBleuError(f"{generate_output}: no such file (fairseq-generate output)")
    if remove_bpe_scheme is not None and remove_bpe_scheme not in BPE_SCHEMES:
        raise DocBleuError(f"--remove-bpe {remove_bpe_scheme}: expected one of "
                           f"{', '.join(BPE_SCHEMES)}")
    _bleu(tokenize, lowercase)  # an unknown tokenizer fails before any reading
    gen = read_generate_output(generate_output, need_references=refs is None)
    doc_of = read_docids(docids)
    n = len(doc_of)
    _check_ids(generate_output, docids, gen.ids, n)
    segs = read_segments(segments, doc_of) if segments is not None else None
    references, refs_from = _references(gen, generate_output, refs, docids, n)
    tok = tokenize or "13a"
    hyps, hyp_info, warnings = _choose_hypotheses(gen, generate_output, hypotheses,
                                                  refs is not None, tok)
    metric_info = _metric(tok, hyp_info["lines"], hyp_info["differ_from_H"], refs is not None,
                          lowercase)
    hyps, references, removed = _without_bpe(
        hyps, references, remove_bpe_scheme, refs is not None,
        f"{generate_output} ({hyp_info['lines']}- lines)", generate_output, refs, gen.ids)

    docs = documents(doc_of)
    spans = [(s, k) for _, s, k in docs]
    one = _bleu(tokenize, lowercase)
    per_doc = []
    for docid, start, k in docs:
        s = one.corpus_score([" ".join(hyps[start:start + k])],
                             [[" ".join(references[start:start + k])]])
        per_doc.append({"docid": docid, "first_line": start, "sentences": k,
                        "bleu": s.score, "hyp_len": s.sys_len, "ref_len": s.ref_len})
    result = {
        "generate_output": generate_output, "docids": docids,
        "sentences": n, "documents": len(docs),
        "hypotheses": hyp_info,
        "references": {"source": "refs" if refs is not None else "T", "description": refs_from},
        "remove_bpe": removed,
        "tokenize": tok,
        "lowercase": lowercase,
        "metric": metric_info,
        "sentence_level": _score(hyps, references, [(i, 1) for i in range(n)], tokenize,
                                 lowercase, "sentence_level"),
        "document_level": _score(hyps, references, spans, tokenize, lowercase,
                                 "document_level"),
        "per_document": per_doc,
        "warnings": warnings,
    }
    if segs is not None:
        result["segment_map"] = segments
        result["segment_level"] = _score(hyps, references, segs, tokenize, lowercase,
                                         "segment_level")
    return result


#: the scores in the report: (key, name, what a segment is)
LEVELS = (("sentence_level", "sentence-level BLEU", "sentences"),
          ("document_level", "document-level BLEU", "documents"),
          ("segment_level", "segment-level BLEU", "segments"))


def format_report(result: Dict) -> str:
    lines = [
        f"generate output: {result['generate_output']}",
        f"docids: {result['docids']} ({result['sentences']} sentences, "
        f"{result['documents']} documents)",
        f"hypotheses: {result['hypotheses']['description']}",
        f"references: {result['references']['description']}",
        f"metric: {result['metric']['description']}",
    ]
    rb = result["remove_bpe"]
    if rb:
        refs = ("--refs: left as it is" if result["references"]["source"] == "refs" else
                f"{rb['references_changed']} of {result['sentences']} references")
        lines.append(f"BPE removed here (--remove-bpe {rb['scheme']}): "
                     f"{rb['hypotheses_changed']} of {result['sentences']} hypotheses, {refs}")
    lines += [f"warning: {w}" for w in result["warnings"]]
    if "segment_level" in result:
        lines.append(f"segments: {result['segment_map']} "
                     f"({result['segment_level']['segments']} segments)")
    for key, name, unit in LEVELS:
        if key not in result:
            continue
        r = result[key]
        lines += [f"{name} ({r['segments']} {unit}): {r['bleu']:.2f} "
                  f"[{result['metric']['label']}]",
                  f"  computes: {r['computes']}",
                  f"  {r['sacrebleu']}", f"  signature: {r['signature']}"]
    return "\n".join(lines)


def format_documents(result: Dict) -> str:
    lines = ["| document | first line | sentences | BLEU | hyp_len | ref_len |",
             "|---|---:|---:|---:|---:|---:|"]
    for d in result["per_document"]:
        lines.append(f"| {d['docid']} | {d['first_line']} | {d['sentences']} | "
                     f"{d['bleu']:.2f} | {d['hyp_len']} | {d['ref_len']} |")
    return "\n".join(lines)


def plot(result: Dict, png: str) -> None:
    plt = pyplot()
    per = result["per_document"]
    scores = [d["bleu"] for d in per]
    doc_b, sent_b = result["document_level"]["bleu"], result["sentence_level"]["bleu"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    ax1.bar(range(len(per)), scores, width=0.8 if len(per) <= 60 else 1.0, color="tab:blue")
    lines = [(doc_b, "document-level", "-"), (sent_b, "sentence-level", "--")]
    if "segment_level" in result:
        lines.append((result["segment_level"]["bleu"], "segment-level", ":"))
    for value, label, style in lines:
        ax1.axhline(value, color="tab:red", ls=style, lw=1, label=f"{label} BLEU {value:.2f}")
        ax2.axvline(value, color="tab:red", ls=style, lw=1)
    if len(per) <= 30:
        ax1.set_xticks(range(len(per)))
        ax1.set_xticklabels([d["docid"] for d in per], rotation=60, ha="right", fontsize=7)
    ax1.set_xlabel("document (corpus order)")
    ax1.set_ylabel("BLEU of the document")
    ax1.set_title(f"BLEU per document ({result['documents']} documents, "
                  f"{result['sentences']} sentences)")
    ax1.legend(fontsize=8)
    ax2.hist(scores, bins=min(20, max(5, len(per) // 3)), range=(0, 100), color="tab:blue")
    ax2.set_xlabel("BLEU of the document")
    ax2.set_ylabel("documents")
    ax2.set_title("distribution")
    refs = "--refs" if result["references"]["source"] == "refs" else "T- lines"
    fig.suptitle(f"{result['metric']['kind']} ({result['document_level']['signature']}); "
                 f"{result['hypotheses']['lines']}- lines against {refs}", fontsize=8)
    save_figure(fig, png)


def write_outputs(result: Dict, out_dir: str, prefix: str = "doc_bleu") -> Dict[str, str]:
    markdown = (f"# Document-level and sentence-level BLEU: {result['metric']['kind']}\n\n```\n"
                + format_report(result) + "\n```\n\n## BLEU per document\n\n"
                + format_documents(result) + "\n")
    return write_table_files(out_dir, prefix, markdown, result, lambda png: plot(result, png),
                             ensure_ascii=False)


def get_parser() -> argparse.ArgumentParser:
    from sacrebleu.metrics import BLEU

    p = argparse.ArgumentParser(
        prog=PROG,
        description="Document-level BLEU (sentences of each document concatenated, one "
                    "segment per document) beside sentence-level BLEU and, given a segment "
                    "map, segment-level BLEU, each with sacreBLEU's signature, of a "
                    "fairseq-generate output and the split's docids file.")
    p.add_argument("generate_output", help="what fairseq-generate printed (S-/T-/H-/D- lines)")
    p.add_argument("--docids", required=True, metavar="FILE",
                   help="document id of each sentence of the generated split ({split}.docids)")
    p.add_argument("--refs", default=None, metavar="FILE",
                   help="references, one line per sentence in corpus order, scored as given: "
                        "detokenized text for sacreBLEU, tokenized like the H- lines for "
                        "--tokenize none (default: the T- lines)")
    p.add_argument("--hypotheses", choices=HYPOTHESES, default="auto",
                   help="score the D- lines (fairseq-generate's detokenized hypotheses, or "
                        "post-processed ones) or the H- lines (the data's tokenization); auto: "
                        "D- where the file has them (default)")
    p.add_argument("--remove-bpe", nargs="?", const="subword_nmt", default=None,
                   choices=BPE_SCHEMES, metavar="SCHEME",
                   help="remove BPE from the H-/D-/T- lines (subword_nmt when given alone, or "
                        "sentencepiece); without it, BPE markers left in the text are an "
                        "error. Alone, it must not stand right before the output file name")
    p.add_argument("--tokenize", default=None, choices=list(BLEU.TOKENIZERS), metavar="TOK",
                   help="sacreBLEU tokenizer (default 13a: sacreBLEU on detokenized text; "
                        "none: tokenized BLEU of text tokenized beforehand): "
                        + ", ".join(BLEU.TOKENIZERS))
    p.add_argument("--lowercase", "-lc", action="store_true",
                   help="lower-case hypotheses and references before scoring (sacreBLEU's "
                        "case:lc); with --tokenize none over tokenized text: lower-cased "
                        "tokenized BLEU, Sun et al. 2022's s-BLEU and d-BLEU (multi-bleu.perl -lc)")
    p.add_argument("--segments", default=None, metavar="FILE",
                   help="segment map: one line per segment, its sentence ids (consecutive, one "
                        "document); adds the segment-level BLEU (G-Transformer's d-BLEU: "
                        "segments' sentences joined)")
    p.add_argument("--out-dir", default=".", help="where to write the table/JSON/PNG")
    p.add_argument("--prefix", default="doc_bleu", help="output file name prefix")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script ``ctx-doc-bleu``. Returns None (a console script's
    return value becomes its exit status); the files written are
    ``OUT_DIR/PREFIX.{md,json,png}``. Errors exit with status 2."""
    p = get_parser()
    args = p.parse_args(argv)
    try:
        result = doc_bleu(args.generate_output, args.docids, args.refs, args.hypotheses,
                          args.remove_bpe, args.tokenize, args.lowercase, args.segments)
    except (OSError, ValueError) as err:
        p.error(str(err))
    paths = write_outputs(result, args.out_dir, args.prefix)
    print_written(paths.values(), format_report(result))


if __name__ == "__main__":
    cli_main()
