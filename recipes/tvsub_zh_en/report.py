"""results.json / results.md of the TVsub recipe (recipes/tvsub_zh_en/run.sh).

    python report.py json|md WORK MODE MODEL...

Per model (``sentence`` is the stage-1 transformer): BLEU with every
reference and with the first (sentence level) and document-level BLEU
(``WORK/results/M/bleu.json``, ``prep_tvsub score``; ``doc_bleu.json``,
``ctx-doc-bleu`` against the first reference), the context's contribution
(``WORK/results/M/cxmi/cxmi.json``, ctx-cxmi: CXMI of Fernandes et al. 2021,
the true against the empty context, mean of per-sentence means, with its
document-bootstrap interval, shuffled beside it, the curve over context sizes
and the pronouns' P-CXMI; ``no context`` for sentence-level models), BLEU on
the held-out episodes and the paired p-values against the transformer
(``paired_{test,heldout}.json``), the context gate on dev (``gate.log``,
fairseq-validate), the target-token budget (``budget.json``), training speed (mean of fairseq's ``wps``: target tokens per
second), peak resident memory of ``fairseq-train`` (GNU time, KB; the host
process: on a GPU the device memory is not in it) and the exact training
options (``checkpoints/M/train.args``) and the exact command lines of its
training, translation and CXMI (``WORK/commands/M.TOOL.sh``, written by
run.sh) and of the run (``WORK/commands/run.sh``). A model without results
yet is listed as such (nothing is made up). No path of the machine that ran
it: a path under WORK is written ``$WORK/...``, one under the repository
relative to its root (:func:`portable_paths`).

The dropped pronouns (issue 38; the steps after the others, where the test
split has a +DP source): DP recall (overall, without ``3sg-n``, per class)
and pronoun precision (all sentences, sentences without a restored pronoun)
of ``ctx-dp-eval`` (``results/M/dp.json``), its McNemar test and paired
bootstrap against the transformer (``dp_paired.json``), the contrastive
suite's accuracy with the true and with shuffled context by class and swap
kind (``dp_suite/report.json``), the P-CXMI of the English pronouns of the
test split's sentences with a restored pronoun (``cxmi_test/tokens.jsonl``:
the sentences from ctx-dp-eval's alignment), and per model the checkpoint
scored, its update and how it was chosen (``checkpoint.json``, written by
``report.py checkpoint WORK CKPT``, the ``provenance_M`` step).

    python report.py checkpoint WORK CKPT
"""

import json
import os
import re
import statistics
import sys


ARCH = {"sentence": "transformer (stage 1)", "transformer": "transformer (continued)",
        "concat": "transformer_concat (2-to-2)", "context_aware": "transformer_context_aware",
        "zhang2018": "transformer_doc_zhang2018 (encoder)", "han": "transformer_han (joint)",
        "han_enc": "transformer_han_enc (encoder)",
        "selective": "transformer_selective_doc (encoder, online, H-attention)",
        "dc": "transformer_dc (sentence-level)", "hybrid": "transformer_hybrid (sentence-level)",
        "doc2doc": "transformer, doc2doc greedy segments (Junczys-Dowmunt 2019)",
        "doc2doc_mr": "transformer, multi-resolution doc2doc (Sun et al. 2022), fine-tuned from the "
                      "sentence model (theirs: from scratch)",
        "gtrans": "transformer_gtrans, G-Transformer (Bao et al. 2021)"}
#: the tools whose exact command lines run.sh records (WORK/commands/NAME.TOOL.sh)
TOOLS = ("fairseq-train", "fairseq-generate", "ctx-iterative-decode",
         "fairseq-generate.heldout", "ctx-iterative-decode.heldout", "ctx-cxmi",
         "fairseq-validate", "ctx-cxmi.test", "ctx-score-contrastive",
         "ctx-score-contrastive.shuffled")
SENTENCE_LEVEL = {"sentence", "transformer", "dc", "hybrid"}
#: the repository's root (this file is recipes/tvsub_zh_en/report.py)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spellings(path):
    """``path`` absolute, as given and with its links resolved (longest first)."""
    out = {os.path.abspath(path), os.path.realpath(path)}
    return sorted((p for p in out if p != os.sep), key=len, reverse=True)


def portable_paths(text, work, repo=None):
    """``text`` (a command line, options) without the machine's paths: an
    absolute path in or under ``work`` is written ``$WORK`` / ``$WORK/...``,
    one in or under ``repo`` relative to it (``.`` for the root itself);
    anything else (a relative path, a path elsewhere, a path that merely
    begins with the same characters) is left as is. ``None`` stays ``None``.
    ``repo``: this repository's root (:data:`REPO`) unless given."""
    if text is None:
        return None
    repo = REPO if repo is None else repo
    # the deeper directory first (WORK is usually under the repository)
    roots = [(p, "$WORK") for p in _spellings(work)] + [(p, None) for p in _spellings(repo)]
    roots.sort(key=lambda r: len(r[0]), reverse=True)
    for root, name in roots:
        # the directory itself (a whole path: not the start of a longer name; a
        # "/" after it kept), or the directory followed by a path inside it
        # (group 1 None); a path of the repository is written relative to it
        start = r"(?<![\w.$~/-])" + re.escape(root)
        pat = re.compile(start + r"(/?)(?![\w.~/-])|" + start + r"/(?=[\w.~-])")
        if name is not None:
            text = pat.sub(lambda m: name + ("/" if m.group(1) is None else m.group(1)), text)
        else:
            text = pat.sub(lambda m: "" if m.group(1) is None else "." + m.group(1), text)
    return text


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


#: a number as fairseq logs it ({:g}: 1.2e-05 included)
NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"


def _train_stats(work, name):
    log = os.path.join(work, "logs", f"train-{name}.log")
    wps, wpb, updates, overflow = [], [], None, []
    if os.path.exists(log):
        for line in open(log, encoding="utf-8", errors="replace"):
            if re.search(r"\| (train_inner|train) \|", line):
                m = re.search(r"\bwps[= ]" + NUM, line)
                if m:
                    wps.append(float(m.group(1)))
                m = re.search(r"\bwpb[= ]" + NUM, line)
                if m:
                    wpb.append(float(m.group(1)))
                m = re.search(r"\bword_overflow[= ]" + NUM, line)
                if m:
                    overflow.append(float(m.group(1)))
                m = re.search(r"\bnum_updates[= ](\d+)", line)
                if m:
                    updates = int(m.group(1))
    peak = None
    kb = os.path.join(work, "logs", f"peak-{name}.kb")
    if os.path.exists(kb):
        vals = [int(x) for x in open(kb).read().split() if x.isdigit()]
        peak = max(vals) if vals else None  # a resumed training appends its own
    args = os.path.join(work, "checkpoints", name, "train.args")
    options = None
    if os.path.exists(args):
        options = " ".join(line[4:] for line in open(args, encoding="utf-8").read().splitlines()
                           if line.startswith("arg="))
    commands = {}
    for tool in TOOLS:
        path = os.path.join(work, "commands", f"{name}.{tool}.sh")
        if os.path.exists(path):
            commands[tool] = portable_paths(open(path, encoding="utf-8").read().strip(), work)
    return {"train_wps_mean": round(statistics.mean(wps), 1) if wps else None,
            "commands": commands,
            # selective trained with --doc-word-capacity (removed in issue 24; a
            # run before it): the largest share of token-heads whose sparsemax
            # support exceeded it in a logged interval (0: exact); a run since
            # logs word_overflow 0 without a capacity: none
            "word_overflow_max": max(overflow) if overflow and options and
            "--doc-word-capacity" in options.split() else None,
            "target_tokens_per_update": round(statistics.mean(wpb), 1) if wpb else None,
            "updates": updates, "peak_rss_kb": peak,
            "train_options": portable_paths(options, work)}


def collect(work, mode, models):
    prep = _load(os.path.join(work, "docs", "prep.json")) or {}
    out = {"mode": mode, "eval_split": prep.get("eval_split"),
           "test": {k: prep.get("test", {}).get(k) for k in ("sentences", "references", "sysids",
                                                             "documents")},
           "train": prep.get("train"), "models": {}}
    run = os.path.join(work, "commands", "run.sh")
    out["command"] = portable_paths(open(run, encoding="utf-8").read().strip(), work) \
        if os.path.exists(run) else None
    for m in models:
        d = os.path.join(work, "results", m)
        bleu, doc = _load(os.path.join(d, "bleu.json")), _load(os.path.join(d, "doc_bleu.json"))
        cx = _load(os.path.join(d, "cxmi", "cxmi.json"))
        row = {"architecture": ARCH.get(m, m)}
        if bleu:
            row["bleu_all_refs"] = bleu["sentence_level"]["all_references"]["bleu"]
            row["bleu_first_ref"] = bleu["sentence_level"]["first_reference"]["bleu"]
            row["d_bleu_all_refs"] = bleu["document_level"]["all_references"]["bleu"]
            row["signature"] = bleu["sentence_level"]["all_references"]["signature"]
        if doc:
            row["d_bleu_first_ref"] = doc["document_level"]["bleu"]
            row["d_bleu_signature"] = doc["document_level"]["signature"]
        seg = _load(os.path.join(d, "segment_bleu.json"))
        if seg:  # issue 39: the per-segment d-BLEU (the doc2doc rows' segment map)
            row["d_bleu_segments_first_ref"] = seg["segment_level"]["bleu"]
            row["segments"] = seg["segment_level"]["segments"]
        ps = _load(os.path.join(d, "paired_segments.json"))
        if ps and ps.get("segments"):  # the paired bootstrap over those segments
            g = ps["segments"]
            row["paired_segments"] = {"p_segments": g["p_value"], "delta_d_bleu": g["delta"],
                                      "segments": g["segments"], "note": g.get("note"),
                                      "signature": g["signature"]}
        split = _load(os.path.join(d, "doc2doc_split.json"))
        if split:
            row["doc2doc_split"] = {k: split.get(k) for k in (
                "segments", "mismatched_segments", "doc2doc_max_tokens")}
        heldout_n = _lines(os.path.join(work, "docs", "heldout.docids"))
        if m in SENTENCE_LEVEL:
            row["cxmi"] = "no context"
        elif cx and "none" not in cx:
            row["cxmi"] = None  # an earlier version's cxmi.json
        elif cx:
            row.update(_cxmi_fields(cx, heldout_n))
        else:
            row["cxmi"] = None
        hb = _load(os.path.join(d, "heldout", "bleu.json"))
        if hb:
            row["heldout_bleu"] = hb["sentence_level"]["bleu"]
            row["heldout_d_bleu"] = hb["document_level"]["bleu"]
        for split in ("test", "heldout"):
            pj = _load(os.path.join(d, f"paired_{split}.json"))
            if pj:
                row[f"paired_{split}"] = {
                    "p_sentences": pj["sentences"]["p_value"],
                    "delta_bleu": pj["sentences"]["delta"],
                    "p_documents": (pj["documents"] or {}).get("p_value"),
                    "delta_d_bleu": (pj["documents"] or {}).get("delta"),
                    "documents": (pj["documents"] or {}).get("segments"),
                    "note": (pj["documents"] or {}).get("note"),
                    "signature": pj["sentences"]["signature"]}
        row["checkpoint"] = _load(os.path.join(d, "checkpoint.json"))
        if isinstance(row.get("cxmi"), float):
            frozen = cx.get("sentence_level_frozen")
            if frozen is None and row["checkpoint"]:
                frozen = row["checkpoint"].get("sentence_level_frozen")
            row["sentence_level_frozen"] = frozen
            row["cxmi_co_primary"] = "shuffled" if frozen else None
            row.update(_eos_split(cx, os.path.join(d, "cxmi", "tokens.jsonl")))
        row.update(dp_fields(work, m))
        row["gate_dev"] = _gate(os.path.join(d, "gate.log"))
        row["budget"] = _load(os.path.join(d, "budget.json"))
        row.update(_train_stats(work, m))
        out["models"][m] = row
    return out


def read_tokens(path):
    """ctx-cxmi's tokens.jsonl records (None: no file)."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def _mean_of(words, cond, keep):
    vals = [r["p_cxmi"][cond] for r in words if keep(r) and cond in r["p_cxmi"]]
    return {"count": len(vals), "mean_p_cxmi": (sum(vals) / len(vals)) if vals else None}


def _eos_split(cx, tokens_path):
    """P-CXMI over all words without ``</s>`` and of ``</s>`` alone (against
    the empty context): cxmi.json's groups where it has them (ctx-cxmi since
    issue 38), else from its tokens.jsonl (an earlier cxmi.json counts ``</s>``
    among all words)."""
    wc = (cx.get("word_classes") or {}).get("none") or {}
    if "</s>" in wc and wc.get("all words", {}).get("excludes") == "</s>":
        return {"p_cxmi_words": {k: wc["all words"][k] for k in ("count", "mean_p_cxmi")},
                "p_cxmi_eos": {k: wc["</s>"][k] for k in ("count", "mean_p_cxmi")}}
    words = read_tokens(tokens_path)
    if not words:
        return {}
    return {"p_cxmi_words": _mean_of(words, "none", lambda r: r["word"] != "</s>"),
            "p_cxmi_eos": _mean_of(words, "none", lambda r: r["word"] == "</s>")}


def dp_sentences(work):
    """Per line of the test split: does the +DP source restore a pronoun
    there (ctx-dp-eval's alignment; a line it skips counts as none)? None
    without docs/test.dp.zh."""
    src, dp = os.path.join(work, "docs", "test.zh"), os.path.join(work, "docs", "test.dp.zh")
    if not os.path.exists(dp):
        return None
    from ctx_fairseq.eval.pronouns.dp_eval import analyse_sources

    _, alignments, _, _ = analyse_sources(src, dp)
    return [a is not None and sum(a.dropped().values()) > 0 for a in alignments]


def is_pronoun(word):
    """An English personal pronoun (ctx-dp-eval's forms) as ctx-cxmi's
    BPE-merged reference word."""
    from ctx_fairseq.eval.pronouns.dropped import EN_CLASSES, english_words

    w = english_words(word)
    return len(w) == 1 and w[0] in EN_CLASSES


def dp_pcxmi(words, dp):
    """P-CXMI (per condition) of the English pronouns of the sentences with a
    restored pronoun, and of the other sentences' pronouns beside it."""
    conds = list(words[0]["p_cxmi"]) if words else []
    out = {}
    for c in conds:
        out[c] = {
            "dp_sentences": _mean_of(words, c, lambda r: dp[r["sentence"]] and is_pronoun(r["word"])),
            "other_sentences": _mean_of(words, c, lambda r: not dp[r["sentence"]]
                                        and is_pronoun(r["word"]))}
    return out


def dp_fields(work, m, dp_mask=None):
    """The dropped-pronoun figures of model ``m`` (module docstring); {} when
    none were measured."""
    d = os.path.join(work, "results", m)
    row = {}
    dp = _load(os.path.join(d, "dp.json"))
    if dp:
        row["dp"] = {k: dp.get(k) for k in (
            "recall", "recall_interval", "recall_without_neuter", "recall_without_neuter_interval",
            "precision_all", "precision_all_interval", "precision_non_dp",
            "precision_non_dp_interval", "items", "dp_sentences", "scored_sentences",
            "skipped")}
        row["dp"]["by_class"] = {c: {"items": v["items"], "recall": v["recall"],
                                     "recall_interval": v["recall_interval"]}
                                 for c, v in dp["by_class"].items()}
    pj = _load(os.path.join(d, "dp_paired.json"))
    if pj:
        row["dp_paired"] = {k: {"mcnemar_p": v["mcnemar_p"], "only_transformer": v["only_a"],
                                "only_model": v["only_b"], "items": v["items"],
                                "recall_delta": v["paired_bootstrap"]["delta"],
                                "recall_delta_interval": v["paired_bootstrap"]["interval"],
                                "bootstrap_p": v["paired_bootstrap"]["p_value"]}
                            for k, v in pj["comparison"].items()}
    sr = _load(os.path.join(d, "dp_suite", "report.json"))
    if sr:
        runs = {}
        for r in sr["runs"]:
            name = os.path.basename(r["scores"])[len("contrastive_"):-len(".json")]
            runs[name] = {"items": r["items"], "by_class": r["by_class"],
                          "by_kind": r["by_kind"]}
        row["contrastive"] = runs
    words = read_tokens(os.path.join(d, "cxmi_test", "tokens.jsonl"))
    if words:
        mask = dp_mask if dp_mask is not None else dp_sentences(work)
        if mask is not None:
            row["p_cxmi_dp"] = dp_pcxmi(words, mask)
    return row


def checkpoint_info(work, path):
    """The scored checkpoint: its file, update number, validation loss, the
    metric and split it was chosen on (prep.json), and whether its
    sentence-level path is frozen (its own arguments)."""
    import torch

    from ctx_fairseq.eval.context_use.cxmi import sentence_level_frozen

    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = state.get("cfg") or {}
    if not cfg and state.get("args") is not None:
        cfg = {"model": state["args"]}
    hist = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}

    def opt(group, key):
        g = cfg.get(group) if hasattr(cfg, "get") else None
        return None if g is None else g.get(key) if hasattr(g, "get") else getattr(g, key, None)

    prep = _load(os.path.join(work, "docs", "prep.json")) or {}
    best = os.path.basename(path) == "checkpoint_best.pt"
    valid_docs = ", ".join(prep.get("valid", {}).get("documents") or []) or "valid"
    test_docs = ", ".join(prep.get("test", {}).get("documents") or []) or "test"
    chosen = (f"{os.path.basename(path)}: the lowest {opt('checkpoint', 'best_checkpoint_metric') or 'loss'} "
              f"on {prep.get('checkpoint_chosen_on') or valid_docs}") if best else \
        f"{os.path.basename(path)}: the last checkpoint (no validation: not chosen on any split)"
    return {"checkpoint": portable_paths(path, work), "num_updates": hist[-1].get("num_updates"),
            "val_loss": extra.get("val_loss"), "best_checkpoint_metric":
            opt("checkpoint", "best_checkpoint_metric"), "valid_subset": opt("dataset", "valid_subset"),
            "chosen": chosen, "chosen_on": valid_docs if best else None, "reported_on": test_docs,
            "reported_on_chosen_set": prep.get("reported_on_chosen_set"),
            "sentence_level_frozen": sentence_level_frozen(cfg)}


def _lines(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _cxmi_fields(cx, heldout_n):
    """The headline (true against empty context, the paper's normalisation,
    document-bootstrap interval), shuffled beside it, the curve and the
    pronoun class's P-CXMI from ctx-cxmi's cxmi.json."""
    row = {"cxmi_split": "heldout" if heldout_n == cx["sentences"] else cx["split"],
           "cxmi_documents": cx["documents"], "cxmi_sentences": cx["sentences"],
           "cxmi": round(cx["none"]["cxmi"], 5),
           "cxmi_interval": cx["none"]["interval"],
           "cxmi_per_token": round(cx["none"]["cxmi_per_token"], 5),
           "logprob_true_per_token": round(cx["logprob_true_per_token"], 5),
           "context_size": cx.get("context_size"),
           "sample_context_size": cx.get("sample_context_size")}
    if "shuffled" in cx:
        row["cxmi_shuffled"] = round(cx["shuffled"]["cxmi"], 5)
        row["cxmi_shuffled_interval"] = cx["shuffled"]["interval"]
    if cx.get("curve"):
        row["curve"] = [{"context_size": p["context_size"], "cxmi": round(p["cxmi"], 5),
                         "interval": p["interval"]} for p in cx["curve"]]
    wc = (cx.get("word_classes") or {}).get("none")
    if wc:
        row["p_cxmi_all_words"] = wc["all words"]
        row["p_cxmi_pronouns"] = wc.get("pronouns")
    ws = (cx.get("word_classes") or {}).get("shuffled")
    if ws:  # the sensitivity check per class (true against another position's context)
        row["p_cxmi_shuffled_all_words"] = ws["all words"]
        row["p_cxmi_shuffled_pronouns"] = ws.get("pronouns")
    return row


#: the English personal pronouns by person and number (the pronoun table's columns)
PERSONS = (("I", "i me my mine myself"), ("you", "you your yours yourself yourselves"),
           ("he/she", "he him his himself she her hers herself"), ("it", "it its itself"),
           ("we", "we us our ours ourselves"), ("they", "they them their theirs themselves"))


def _person_means(pr):
    """The pronoun class's mean P-CXMI per person (count-weighted over its
    words' means in ``by_word``) as ``[(mean or None, count)]`` in PERSONS' order."""
    by = {b["word"]: b for b in pr.get("by_word") or []}
    out = []
    for _, words in PERSONS:
        rows = [by[w] for w in words.split() if w in by]
        n = sum(b["count"] for b in rows)
        out.append((sum(b["mean_p_cxmi"] * b["count"] for b in rows) / n if n else None, n))
    return out


def _pronoun_lines(res):
    """The pronoun class in detail, one row per context model: against the
    empty context and against shuffled context, each beside the mean over all
    words; split by repetition from the previous reference sentence; per person."""
    rows = [(m, r) for m, r in res["models"].items()
            if (r.get("p_cxmi_pronouns") or {}).get("by_word") is not None]
    if not rows:
        return []

    def mean(g, key=None):
        g = g if key is None else (g or {}).get(key)
        return "-" if not g or g.get("mean_p_cxmi") is None else f"{g['mean_p_cxmi']:.4f}"

    def minus(g):
        return "-" if not g or g.get("minus_all_words") is None else \
            f"{g['minus_all_words']:.4f}{_iv(g.get('minus_all_words_interval'))}"

    lines = ["", "## The English pronouns in detail", "",
             "| model | vs empty: pronouns / all words | minus all words [interval] "
             "| vs shuffled: pronouns / all words | minus all words [interval] "
             "| repeated from the previous sentence: pronouns / all words (pronoun count) "
             "| not repeated: pronouns / all words (pronoun count) | "
             + " | ".join(f"{name} (count)" for name, _ in PERSONS) + " |",
             "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(PERSONS)]
    for m, r in rows:
        pr, al = r["p_cxmi_pronouns"], r["p_cxmi_all_words"]
        ps, als = r.get("p_cxmi_shuffled_pronouns"), r.get("p_cxmi_shuffled_all_words")
        rep = f"{mean(pr, 'in_previous_reference')} / {mean(al, 'in_previous_reference')} " \
            f"({pr['in_previous_reference']['count']})"
        nrep = f"{mean(pr, 'not_in_previous_reference')} / " \
            f"{mean(al, 'not_in_previous_reference')} " \
            f"({pr['not_in_previous_reference']['count']})"
        persons = " | ".join("-" if v is None else f"{v:.4f} ({n})"
                             for v, n in _person_means(pr))
        lines.append(f"| {m} | {mean(pr)} / {mean(al)} | {minus(pr)} "
                     f"| {mean(ps)} / {mean(als)} | {minus(ps)} | {rep} | {nrep} | {persons} |")
    lines += ["", "Mean P-CXMI per word (nats) of the English personal pronouns on the CXMI "
              "split, against the empty context (the paper's) and against shuffled context (a "
              "sensitivity check), each beside the mean over all words; the difference with its "
              "95% document interval (the same draws). Repeated: the word is a word of the "
              "previous reference sentence of the same document (a surface repetition; all "
              "words: punctuation included, </s> in neither half); a model that copies from "
              "its context (with a source context: the translations of its words) would gain "
              "there and lose on the others. Per person: the pronoun's forms "
              "(I: i, me, my, mine, myself; and so on), against the empty context."]
    return lines


def _pc(v):
    return "-" if v is None else f"{100 * v:.1f}"


def _pciv(v, iv):
    return _pc(v) + ("" if not iv else f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]")


def _m(g):
    return "-" if not g or g.get("mean_p_cxmi") is None else \
        f"{g['mean_p_cxmi']:.4f} ({g['count']})"


def _cxmi_words_lines(res):
    """CXMI's headline with its co-primary figure, P-CXMI over the words
    without </s> and of </s>, and on the test split's DP sentences."""
    rows = [(m, r) for m, r in res["models"].items() if isinstance(r.get("cxmi"), float)]
    if not rows:
        return []
    lines = ["", "## CXMI: the figure to read, words and </s>, the sentences with a dropped "
             "pronoun", "",
             "| model | sentence level frozen | primary | CXMI vs empty | CXMI vs shuffled "
             "| P-CXMI all words without </s> (count) | P-CXMI of </s> (count) "
             "| test split: pronoun P-CXMI in DP sentences (count) | in the other sentences "
             "(count) |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for m, r in rows:
        frozen = r.get("sentence_level_frozen")
        primary = "empty and shuffled (co-primary)" if frozen else "empty"
        dpx = (r.get("p_cxmi_dp") or {}).get("none") or {}
        sh = r.get("cxmi_shuffled")
        lines.append(f"| {m} | {'-' if frozen is None else ('yes' if frozen else 'no')} "
                     f"| {primary} | {r['cxmi']:.4f} | {'-' if sh is None else f'{sh:.4f}'} "
                     f"| {_m(r.get('p_cxmi_words'))} | {_m(r.get('p_cxmi_eos'))} "
                     f"| {_m(dpx.get('dp_sentences'))} | {_m(dpx.get('other_sentences'))} |")
    lines += ["", "All words: the reference's words without the end of sentence (one `</s>` "
              "per sentence, never a word of the text, on its own column). A model whose "
              "sentence-level path is frozen (`--freeze-sentence-level`, read from the "
              "checkpoint's own arguments) is its stage-1 model under the empty context: "
              "CXMI against the empty context measures the adapter it added, not context use, "
              "so CXMI against shuffled context is its co-primary figure. DP sentences: the "
              "test split's sentences where the +DP source restores a pronoun (ctx-dp-eval's "
              "alignment); pronoun P-CXMI: the English personal pronouns of their reference "
              "(ctx-cxmi on the test split, `cxmi_test`, against the empty context; one "
              "document: no document interval, see results-dp.md of dp_study.sh for intervals "
              "over seeds and sentences)."]
    return lines


def dp_lines(res):
    """The dropped-pronoun tables (ctx-dp-eval, ctx-dp-suite)."""
    rows = [(m, r) for m, r in res["models"].items() if r.get("dp") or r.get("contrastive")]
    if not rows:
        return []
    lines = ["", "## Dropped pronouns (the test split's +DP source)", "",
             "| model | BLEU (all refs) | DP recall % [95%] | without 3sg-n % [95%] "
             "| pronoun precision % [95%] | precision, non-DP sentences % [95%] "
             "| contrastive: items % true / shuffled context | person 1/2 swaps % true / "
             "shuffled | vs transformer: recall delta [95%], bootstrap p, McNemar p "
             "(only transformer / only model) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def acc(r, run, key, sub=None):
        g = (r.get("contrastive") or {}).get(run)
        if not g:
            return "-"
        g = g[key] if sub is None else g[key].get(sub)
        return "-" if not g or g.get("accuracy") is None else f"{100 * g['accuracy']:.1f}"

    classes = []
    for m, r in rows:
        dp = r.get("dp") or {}
        for c in (dp.get("by_class") or {}):
            if c not in classes:
                classes.append(c)
        pv = (r.get("dp_paired") or {}).get("all")
        vs = "-" if m == "transformer" else "not yet"
        if pv:
            iv = pv["recall_delta_interval"]
            vs = (f"{_pc(pv['recall_delta'])}"
                  + ("" if not iv else f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]")
                  + f", p {_p(pv['bootstrap_p'])}, McNemar p {_p(pv['mcnemar_p'])} "
                  f"({pv['only_transformer']} / {pv['only_model']})")
        lines.append(
            f"| {m} | {_fmt(r.get('bleu_all_refs'))} "
            f"| {_pciv(dp.get('recall'), dp.get('recall_interval'))} "
            f"| {_pciv(dp.get('recall_without_neuter'), dp.get('recall_without_neuter_interval'))} "
            f"| {_pciv(dp.get('precision_all'), dp.get('precision_all_interval'))} "
            f"| {_pciv(dp.get('precision_non_dp'), dp.get('precision_non_dp_interval'))} "
            f"| {acc(r, 'true', 'items')} / {acc(r, 'shuffled', 'items')} "
            f"| {acc(r, 'true', 'by_kind', 'person-1/2')} / "
            f"{acc(r, 'shuffled', 'by_kind', 'person-1/2')} | {vs} |")
    first = next((r["dp"] for _, r in rows if r.get("dp")), None)
    if first:
        lines += ["", f"{first['items']} items (restored pronouns a reference supports) in "
                  f"{first['dp_sentences']} sentences with a restored pronoun, of "
                  f"{first['scored_sentences']} scored ({first['skipped']} skipped: the +DP "
                  "line does not hold the plain line)."]
    lines += ["", "Per class: DP recall % (items) and contrastive accuracy % of the items, "
              "true / shuffled context:", "",
              "| model | " + " | ".join(classes) + " |", "|---|" + "---:|" * len(classes)]
    for m, r in rows:
        cells = []
        for c in classes:
            v = ((r.get("dp") or {}).get("by_class") or {}).get(c) or {}
            cells.append(f"{_pc(v.get('recall'))} ({v.get('items', 0)}); "
                         f"{acc(r, 'true', 'by_class', c)} / {acc(r, 'shuffled', 'by_class', c)}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "DP recall (ctx-dp-eval): of the pronouns the +DP source restores and a "
              "reference supports, the share the translation renders (beyond the source's "
              "overt pronouns of the class); without 3sg-n: the restored *it* left out (an "
              "expletive *it* makes it nearly free). Precision: the translation's pronouns "
              "clipped by the references' (all sentences; the sentences without a restored "
              "pronoun). Intervals: percentile bootstrap over the sentences of this one run "
              "(the spread across training seeds is in dp_study.sh's results-dp.md). "
              "Contrastive (ctx-dp-suite, scored by ctx-score-contrastive with the recipe's "
              "BPE): an item is right when the reference scores above every swapped pronoun; "
              "true context and shuffled context (another document position's: the scorer's "
              "wrong context); sentence-level models have one run (no context). Against the "
              "transformer: ctx-dp-eval's paired bootstrap of the recall difference (model "
              "minus transformer) over sentences and its exact McNemar test on the items."]
    return lines


def doc2doc_lines(res):
    """Issue 39's table: every model's s-BLEU, d-BLEU per document and per segment,
    the paired p and the dropped pronouns, where a run has per-segment d-BLEU."""
    rows = [(m, r) for m, r in res["models"].items() if "d_bleu_segments_first_ref" in r]
    if not rows:
        return []
    lines = ["", "## Documents as the unit of translation: s-BLEU, d-BLEU per document and per "
             "segment", "",
             "| model | architecture | s-BLEU (all refs) [p] | s-BLEU (first ref) "
             "| d-BLEU documents (all refs) | d-BLEU documents (first ref) "
             "| d-BLEU segments (first ref) [p] | DP recall % | DP contrastive % true / shuffled "
             "| segments (mismatched) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, r in rows:
        pt = r.get("paired_test")
        dp = r.get("dp") or {}
        runs = r.get("contrastive") or {}

        def acc(run):
            g = ((runs.get(run) or {}).get("items")) or {}
            return "-" if g.get("accuracy") is None else f"{100 * g['accuracy']:.1f}"
        sp = r.get("doc2doc_split")
        lines.append(
            f"| {m} | {r['architecture']} | {_fmt(r.get('bleu_all_refs'))}"
            + (f" [{_p(pt['p_sentences'])}]" if pt else "")
            + f" | {_fmt(r.get('bleu_first_ref'))} | {_fmt(r.get('d_bleu_all_refs'))} "
            f"| {_fmt(r.get('d_bleu_first_ref'))} | {_fmt(r.get('d_bleu_segments_first_ref'))}"
            + (f" [{_p(r['paired_segments']['p_segments'])}]" if r.get("paired_segments") else "")
            + f" | {_pc(dp.get('recall'))} | {acc('true')} / {acc('shuffled')} "
            f"| {'-' if not sp else str(sp['segments']) + ' (' + str(sp['mismatched_segments']) + ')'} |")
    n = next((r.get("segments") for _, r in rows if r.get("segments")), None)
    lines += ["", "s-BLEU: corpus BLEU over the sentences; d-BLEU documents: each episode's "
              "sentences joined, corpus BLEU over the episodes; d-BLEU segments: the same over "
              f"the greedy segments the doc2doc rows translate ({n} segments, "
              "`segments/test.*.segments`, G-Transformer's d-BLEU), one map for every model "
              "(ctx-doc-bleu --segments, the first reference, --tokenize none). The doc2doc rows "
              "(doc2doc, doc2doc_mr, gtrans) translate segments with the sentence-count frame "
              "(`--doc2doc-frame`), split back into sentences by ctx-doc2doc-split (mismatched: "
              "segments with another number of sentences than their source; 0 under the frame). "
              "p: paired bootstrap against `transformer` (above); for the segments, sacreBLEU's "
              "paired bootstrap drawing whole segments (ctx-paired-bleu --segments, the first "
              "reference, results/MODEL/paired_segments.json). DP: the dropped-pronoun "
              "figures below."]
    return lines


def _checkpoint_lines(res):
    rows = [(m, r["checkpoint"]) for m, r in res["models"].items() if r.get("checkpoint")]
    if not rows:
        return []
    lines = ["", "## Which checkpoint each result is of", "",
             "| model | checkpoint | update | valid loss | chosen | reported on |",
             "|---|---|---:|---:|---|---|"]
    for m, c in rows:
        vl = c.get("val_loss")
        lines.append(f"| {m} | `{c['checkpoint']}` | {_fmt(c.get('num_updates'))} "
                     f"| {'-' if vl is None else f'{vl:.4f}'} | {c['chosen']} "
                     f"| {c['reported_on']}"
                     + (" (the set it was chosen on: not a held-out figure)"
                        if c.get("reported_on_chosen_set") else "") + " |")
    return lines


#: a number as fairseq prints it in its validation line
def _gate(path):
    """The gate statistics of fairseq-validate's line (ctx_mass*: the share
    of the context; gate*) or None (no log, or a model without a gate)."""
    if not os.path.exists(path):
        return None
    out = {}
    for line in open(path, encoding="utf-8", errors="replace"):
        if "valid on" in line and "subset" in line:
            for k, v in re.findall(r"\b((?:ctx_mass|gate|ctx_frac)[A-Za-z_]*)[= ]" + NUM, line):
                out[k] = float(v)
    return out or None


def _iv(iv):
    if not iv:
        return ""
    if iv.get("low") is None:
        return " (no interval: " + iv.get("note", "").split(":")[0] + ")"
    return f" [{iv['low']:.4f}, {iv['high']:.4f}]"


def _p(v):
    return "n/a" if v is None else (f"{v:.3f}" if v >= 0.001 else "<0.001")


def _fmt(v, nd=2):
    if v is None:
        return "not yet"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _chosen_line(res):
    c = next((r["checkpoint"] for r in res["models"].values() if r.get("checkpoint")), None)
    if not c or not c.get("chosen_on"):
        return ""
    return (f" Checkpoints: checkpoint_best.pt, the lowest validation loss, chosen on "
            f"{c['chosen_on']}; reported on {c['reported_on']}"
            + (" (the same set: not a held-out figure)." if c.get("reported_on_chosen_set")
               else "."))


def markdown(res):
    t = res["test"]
    lines = [f"# TVsub zh-en results ({res['mode']} mode"
             + (": tiny models, meaningless numbers" if res["mode"] == "smoke" else "") + ")", "",
             f"Evaluated on the **{res['eval_split']}** set: {t['sentences']} sentences, "
             f"{t['references']} reference(s) ({', '.join(t['sysids'] or [])}), documents "
             f"{', '.join(t['documents'] or [])}." + _chosen_line(res), "",
             "| model | architecture | BLEU (all refs) [p] | BLEU (first ref) | d-BLEU (all refs) "
             "| d-BLEU (first ref, ctx-doc-bleu) | held-out BLEU [p sent., p docs] | held-out d-BLEU "
             "| CXMI vs empty [95% doc. interval] | CXMI vs shuffled | pronoun P-CXMI [interval] / "
             "all words | gate (dev) | target tokens/update | updates | train tokens/s "
             "| peak RSS (MB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sigs = set()
    for m, r in res["models"].items():
        if "signature" in r:
            sigs.add(r["signature"])
        peak = None if r.get("peak_rss_kb") is None else r["peak_rss_kb"] / 1024
        cx = r.get("cxmi")
        cx_text = cx if isinstance(cx, str) else _fmt(cx, 4) + _iv(r.get("cxmi_interval"))
        sh = r.get("cxmi_shuffled")
        sh_text = "-" if sh is None else _fmt(sh, 4) + _iv(r.get("cxmi_shuffled_interval"))
        pr, al = r.get("p_cxmi_pronouns"), r.get("p_cxmi_all_words")
        pr_text = "-" if not pr or pr.get("mean_p_cxmi") is None else \
            f"{pr['mean_p_cxmi']:.4f}{_iv(pr['interval'])} / {al['mean_p_cxmi']:.4f}"
        pt, ph = r.get("paired_test"), r.get("paired_heldout")
        bleu = _fmt(r.get("bleu_all_refs")) + (f" [{_p(pt['p_sentences'])}]" if pt else "")
        hb = _fmt(r.get("heldout_bleu")) if "heldout_bleu" in r else "-"
        if ph:
            hb += f" [{_p(ph['p_sentences'])}, {_p(ph['p_documents'])}]"
        gate = r.get("gate_dev")
        # the context side's weight (ctx_mass*); a model that logs only its gate (the
        # sentence side's weight, e.g. zhang2018's gate_enc): the gate, named
        keys = [k for k in (gate or {}) if k.startswith("ctx_mass")] or \
            [k for k in (gate or {}) if k.startswith("gate")]
        gate_text = "-" if not gate else ", ".join(f"{k} {gate[k]:.3f}" for k in keys)
        budget = r.get("budget") or {}
        tpu = budget.get("target_tokens_per_update", r.get("target_tokens_per_update"))
        lines.append(f"| {m} | {r['architecture']} | {bleu} "
                     f"| {_fmt(r.get('bleu_first_ref'))} | {_fmt(r.get('d_bleu_all_refs'))} "
                     f"| {_fmt(r.get('d_bleu_first_ref'))} | {hb} "
                     f"| {_fmt(r.get('heldout_d_bleu')) if 'heldout_d_bleu' in r else '-'} "
                     f"| {cx_text} | {sh_text} | {pr_text} | {gate_text or '-'} "
                     f"| {_fmt(tpu, 0)} | {_fmt(r.get('updates'))} "
                     f"| {_fmt(r.get('train_wps_mean'), 0)} | {_fmt(peak, 0)} |")
    cx_split = next((r.get("cxmi_split") for r in res["models"].values()
                     if r.get("cxmi_split")), None)
    lines += ["", f"BLEU, BLEU (first ref), d-BLEU: the **{res['eval_split']}** set. Held-out "
              "BLEU and CXMI: the held-out training episodes (never trained on; the README's "
              "'CPU study'), one reference." if cx_split == "heldout" else
              f"BLEU and CXMI: the **{res['eval_split']}** set.",
              "BLEU: the tokenized, lowercased hypotheses (H- lines, BPE removed) against the "
              "references as published, sacreBLEU --tokenize none; signature(s): "
              + "; ".join(sorted(sigs)) + ".",
              "p: paired bootstrap resampling (Koehn 2004) against `transformer`, sacreBLEU's "
              "PairedTest (1,000 resamples, seed 12345; two-sided, of the absolute difference): "
              "over sentences, and over documents (d-BLEU, each document one segment) where there "
              "are at least 10 documents (n/a otherwise).",
              "CXMI (Fernandes et al. 2021): the mean over sentences of the per-sentence mean "
              "token log-probability of the reference with the true context minus with the "
              "empty context, the same model (nats); above zero, the model uses its context. "
              "In brackets: a 95% document block bootstrap interval (1,000 resamples of the "
              "documents, seed 0; none where there are fewer than 10 documents). Shuffled (another "
              "document position's context): a sensitivity check (Voita et al. 2018, Kim et al. "
              "2019). Pronoun P-CXMI: the mean P-CXMI (against empty context) of the English "
              "pronouns per word, its interval, beside the mean over all words.",
              "Gate (dev): the model's context gate measured by fairseq-validate of the scored "
              "checkpoint on the dev set (no CoWord masking, no sampled size: validation has "
              "none), ctx_mass the mean weight on the context side.",
              "Target tokens/update: of the current sentences (budget.py, the epoch-1 batches); "
              "with DOC_TOKENS every stage-2 model trains on the same number of target tokens, "
              "so a context model (the context counts in --max-tokens) trains more updates."]
    over = {m: r["word_overflow_max"] for m, r in res["models"].items()
            if r.get("word_overflow_max") is not None}
    for m, v in over.items():
        lines.append(f"Word level of `{m}`: the largest logged share of query token-heads whose "
                     f"Eq. 3 support exceeded --doc-word-capacity: {v:g} (0: the word level "
                     "was exact throughout training).")
    lines += doc2doc_lines(res)
    lines += _pronoun_lines(res)
    lines += _cxmi_words_lines(res)
    lines += dp_lines(res)
    lines += _checkpoint_lines(res)
    lines += ["", "## Commands", "",
              "The recipe (from the repository's root):", "",
              "```", res.get("command") or "(not recorded)", "```", "",
              "Per model, the exact command lines it ran (training; translation; CXMI), from "
              "the repository's root; `$WORK` is the mode's work directory (`--workdir` DIR: "
              "DIR/smoke, DIR/study, or DIR itself in the GPU mode):", ""]
    for m, r in res["models"].items():
        cmds = r.get("commands") or {}
        if not cmds:
            lines.append(f"- `{m}`: not trained yet")
            continue
        lines += [f"- `{m}`:", "", "  ```"]
        lines += [f"  {cmds[t]}" for t in TOOLS if t in cmds]
        lines += ["  ```", ""]
    return "\n".join(lines) + "\n"


def main(argv):
    if argv[0] == "checkpoint":
        sys.stdout.write(json.dumps(checkpoint_info(argv[1], argv[2]), indent=1) + "\n")
        return
    kind, work, mode, models = argv[0], argv[1], argv[2], argv[3:]
    res = collect(work, mode, models)
    if kind == "json":
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
    else:
        sys.stdout.write(markdown(res))


if __name__ == "__main__":
    main(sys.argv[1:])
