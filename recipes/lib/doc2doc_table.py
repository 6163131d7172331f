"""The doc2doc table of the Maruf et al. pipeline (issue 39; recipes/lib/steps_doc2doc.sh).

    python doc2doc_table.py md|json RESULTS MODEL=LABEL...

One row per model of ``RESULTS/MODEL/``: s-BLEU, d-BLEU per document and d-BLEU
per segment (``ctx-doc-bleu --segments`` on the greedy segment map shared by
every model), tokenized (``tokenized_bleu_segments.json``: the H- lines against
the tokenized, truecased references, ``--tokenize none``) and sacreBLEU
(``sacrebleu_segments.json``: detruecased, detokenized against the original
text, 13a); the pronoun suite's accuracy (``contrastive_pronouns.json``); the
paired bootstrap against the sentence-level transformer (``paired.json``, over
sentences / documents); for a segment model, its segments and how many had
another number of sentences than their source (``doc2doc_split.json``; 0 under
the sentence-count frame). A model without a file has ``-`` there.
"""

import json
import os
import sys


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _p(v):
    return "n/a" if v is None else (f"{v:.3f}" if v >= 0.001 else "<0.001")


def _b(v):
    return "-" if v is None else f"{v:.2f}"


def row(results, model, label):
    d = os.path.join(results, model)
    rec = {"model": model, "architecture": label}
    for kind in ("tokenized_bleu", "sacrebleu"):
        seg = _load(os.path.join(d, f"{kind}_segments.json")) or {}
        base = _load(os.path.join(d, f"{kind}.json")) or seg
        rec[kind] = {
            "s_bleu": (base.get("sentence_level") or {}).get("bleu"),
            "d_bleu_documents": (base.get("document_level") or {}).get("bleu"),
            "d_bleu_segments": (seg.get("segment_level") or {}).get("bleu"),
            "segments": (seg.get("segment_level") or {}).get("segments"),
            "signature": (base.get("sentence_level") or {}).get("signature")}
    c = (_load(os.path.join(d, "contrastive_pronouns.json")) or {}).get("overall")
    rec["pronouns"] = None if c is None else {k: c.get(k) for k in ("accuracy", "correct", "n",
                                                                    "ties")}
    pj = _load(os.path.join(d, "paired.json"))
    rec["paired_vs_transformer"] = None if pj is None else {
        "p_sentences": pj["sentences"]["p_value"], "delta": pj["sentences"]["delta"],
        "p_documents": (pj.get("documents") or {}).get("p_value")}
    ps = (_load(os.path.join(d, "paired_segments.json")) or {}).get("segments")
    if rec["paired_vs_transformer"] is not None and ps is not None:
        rec["paired_vs_transformer"]["p_segments"] = ps["p_value"]
    sp = _load(os.path.join(d, "doc2doc_split.json"))
    rec["doc2doc_split"] = None if sp is None else {
        k: sp.get(k) for k in ("segments", "mismatched_segments", "doc2doc_max_tokens")}
    return rec


def markdown(rows):
    out = ["| model | architecture | s-BLEU | d-BLEU (documents) | d-BLEU (segments) "
           "| sacreBLEU s | d (documents) | d (segments) | pronoun suite % (correct/n) "
           "| p vs transformer (sentences / documents / segments) | segments (mismatched) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sigs = set()
    for r in rows:
        t, s = r["tokenized_bleu"], r["sacrebleu"]
        sigs.update(x["signature"] for x in (t, s) if x["signature"])
        c = r["pronouns"]
        acc = "-" if not c or c["accuracy"] is None else \
            f"{100 * c['accuracy']:.1f} ({c['correct']}/{c['n']})"
        pj = r["paired_vs_transformer"]
        p = "-" if pj is None else (f"{_p(pj['p_sentences'])} / {_p(pj['p_documents'])} / "
                                    + (_p(pj["p_segments"]) if "p_segments" in pj else "-"))
        sp = r["doc2doc_split"]
        segs = "-" if sp is None else f"{sp['segments']} ({sp['mismatched_segments']})"
        out.append(f"| {r['model']} | {r['architecture']} | {_b(t['s_bleu'])} "
                   f"| {_b(t['d_bleu_documents'])} | {_b(t['d_bleu_segments'])} "
                   f"| {_b(s['s_bleu'])} | {_b(s['d_bleu_documents'])} "
                   f"| {_b(s['d_bleu_segments'])} | {acc} | {p} | {segs} |")
    n = next((r["tokenized_bleu"]["segments"] for r in rows if r["tokenized_bleu"]["segments"]),
             None)
    out += ["", "s-BLEU: corpus BLEU over the test sentences; d-BLEU (documents): each document's "
            "sentences joined, corpus BLEU over the documents; d-BLEU (segments): the same over "
            f"the greedy segments every doc2doc model translated ({n} segments, "
            "`segments/test.*.segments`; G-Transformer's d-BLEU), the same map for every model. "
            "s-BLEU, d-BLEU: tokenized BLEU (the H- lines against the tokenized, truecased "
            "references, --tokenize none); sacreBLEU: detruecased and detokenized against the "
            "original text (13a). A segment model's output is split back into sentences by "
            "ctx-doc2doc-split (generated with the sentence-count frame: no segment with another "
            "number of sentences than its source). The pronoun suite scores a segment model's sentence as the last of a segment of its previous sentences, whose translations are the references (a forced prefix: an oracle, as for concat's target context). p: sacreBLEU's paired bootstrap of the "
            "tokenized BLEU against the sentence-level transformer, drawing sentences, documents or "
            "the map's segments (n/a: fewer than 10 documents or segments, or identical scores). Signatures: " + "; ".join(sorted(sigs)) + "."]
    return "\n".join(out) + "\n"


def main(argv):
    kind, results, specs = argv[0], argv[1], argv[2:]
    rows = [row(results, *spec.split("=", 1)) for spec in specs]
    if kind == "json":
        sys.stdout.write(json.dumps({"models": rows}, indent=1) + "\n")
    else:
        sys.stdout.write(markdown(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
