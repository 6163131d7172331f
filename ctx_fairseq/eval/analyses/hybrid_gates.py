"""Gate analyses of ``transformer_hybrid`` (Xu et al., ACL 2019, Section 5.2).

``g_i = sigmoid(w . H_i)`` (Eq. 5) is the weight of the *local* pattern for token i.

* **Per layer (Fig. 3)**: the mean gate of every gated hybrid layer over a
  binarized split, averaged over the real tokens (padding and the end-of-sentence
  token are excluded; with ``--hybrid-gate-per-head`` the heads are averaged too and
  also reported one by one). Encoder layers see the source; decoder layers (if the
  model has any) are run teacher-forced on the reference.
* **By part of speech (Fig. 4)**, ``--pos-tags FILE``: FILE has one line per
  sentence of the split (same order as the raw source text) and one tag per
  whitespace-separated source *word*. Subword pieces (subword-nmt ``@@ `` convention:
  a piece ending in ``@@`` continues into the next one) are joined back into words
  and a word's gate is the mean over its pieces; a tag's value is the mean over its
  words. A line whose tag count differs from the sentence's word count is an error
  naming the file and line.
* **Window sweep (Fig. 2)**, ``python -m ctx_fairseq.eval.analyses.hybrid_gates sweep``:
  collects, for runs trained with different ``--hybrid-window`` m, the BLEU each
  run's ``bleu.json`` holds (the recipes' scoring against the reference files:
  sacreBLEU and, where asked for, tokenized BLEU, with their signatures) and the
  mean gate from the per-layer JSON; see ``recipes/hybrid_window_sweep.sh``.

Each analysis writes ``PREFIX.tsv`` (table), ``PREFIX.json`` and ``PREFIX.png``
(matplotlib, Agg backend; the sweep a ``PREFIX.md`` too) into ``--out-dir``,
each file complete or not at all (written to a ``.part`` file, then renamed).
"""

import argparse
import json
import os
import sys
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ctx_fairseq.eval.report_files import print_written, pyplot

LAYER_PREFIX = "hybrid_gates_by_layer"
POS_PREFIX = "hybrid_gates_by_pos"
SWEEP_PREFIX = "hybrid_window_sweep"


class GateAnalysisError(ValueError):
    """Bad input to a gate analysis (the message names the file/option)."""


# ----------------------------------------------------------- subword words
def word_index_of_pieces(pieces: Sequence[str], separator: str = "@@") -> Tuple[List[int], int]:
    """Map subword pieces to 0-based word indices (subword-nmt convention: a piece
    ending in ``separator`` continues into the next piece). Returns the per-piece
    word index and the number of words."""
    index, word = [], 0
    for i, piece in enumerate(pieces):
        index.append(word)
        if not piece.endswith(separator) or i == len(pieces) - 1:
            word += 1
    return index, word


# --------------------------------------------------------------- collection
class GateCollector:
    """Accumulate the recorded gates of every gated hybrid layer of a model."""

    def __init__(self, model, dictionary, pos_tags: Optional[List[List[str]]] = None,
                 pos_file: str = "", separator: str = "@@"):
        from ctx_fairseq.models.transformer_hybrid import hybrid_attention_modules

        self.modules = [(name, m) for name, m in hybrid_attention_modules(model)
                        if m.gate_proj is not None]
        if not self.modules:
            modes = sorted({m.mode for _, m in hybrid_attention_modules(model)})
            raise GateAnalysisError(
                "the checkpoint has no gated hybrid layers (hybrid modes found: "
                f"{', '.join(modes) or 'none'}); the gate analysis needs --hybrid-mode gate")
        self.dictionary = dictionary
        self.pad, self.eos = dictionary.pad(), dictionary.eos()
        self.sums: Dict[str, torch.Tensor] = {}
        self.counts: Dict[str, int] = {}
        self.pos_tags = pos_tags
        self.pos_file = pos_file
        self.separator = separator
        self.pos_sums: Dict[str, Dict[str, float]] = {}
        self.pos_counts: Dict[str, int] = {}
        self.sentences = 0

    @property
    def needs_decoder(self) -> bool:
        return any(name.startswith("decoder") for name, _ in self.modules)

    def __enter__(self):
        for _, m in self.modules:
            m.record_gates = True
            m.last_gate = None
        return self

    def __exit__(self, *exc):
        for _, m in self.modules:
            m.record_gates = False
            m.last_gate = None

    def add_batch(self, sample) -> None:
        net = sample["net_input"]
        src = net["src_tokens"]
        prev = net.get("prev_output_tokens")
        for name, m in self.modules:
            gate = m.last_gate  # T x B x G
            if gate is None:
                continue
            tokens = src if name.startswith("encoder") else prev
            real = (tokens.ne(self.pad) & tokens.ne(self.eos)).t()  # T x B
            g = gate.double()[real]  # N x G
            self.sums[name] = self.sums.get(name, 0) + g.sum(0).cpu()
            self.counts[name] = self.counts.get(name, 0) + int(g.size(0))
        self.sentences += int(src.size(0))
        if self.pos_tags is not None:
            self._add_pos(sample, src)

    def _add_pos(self, sample, src) -> None:
        enc = [(n, m) for n, m in self.modules if n.startswith("encoder")]
        if not enc:
            raise GateAnalysisError("--pos-tags needs gated hybrid *encoder* layers")
        ids = sample["id"].tolist()
        gates = {n: m.last_gate.double().mean(-1).t().cpu() for n, m in enc}  # B x T
        src = src.cpu()
        for b, sid in enumerate(ids):
            row = src[b]
            keep = row.ne(self.pad) & row.ne(self.eos)
            pieces = [self.dictionary[t] for t in row[keep].tolist()]
            word_of, n_words = word_index_of_pieces(pieces, self.separator)
            if sid >= len(self.pos_tags):
                raise GateAnalysisError(
                    f"{self.pos_file}: has {len(self.pos_tags)} lines but the split has a "
                    f"sentence on line {sid + 1}; expected one tag line per source sentence")
            tags = self.pos_tags[sid]
            if len(tags) != n_words:
                raise GateAnalysisError(
                    f"{self.pos_file}:{sid + 1}: {len(tags)} tags but the source sentence has "
                    f"{n_words} words (subword pieces joined at '{self.separator} '); expected "
                    f"one tag per whitespace-separated word")
            word_of_t = torch.tensor(word_of, dtype=torch.long)
            for name, g in gates.items():
                piece_gates = g[b][keep]
                word_sum = torch.zeros(n_words, dtype=torch.float64).index_add_(
                    0, word_of_t, piece_gates)
                word_len = torch.zeros(n_words, dtype=torch.float64).index_add_(
                    0, word_of_t, torch.ones_like(piece_gates))
                word_gate = (word_sum / word_len).tolist()
                per_tag = self.pos_sums.setdefault(name, {})
                for tag, value in zip(tags, word_gate):
                    per_tag[tag] = per_tag.get(tag, 0.0) + value
            for tag in tags:
                self.pos_counts[tag] = self.pos_counts.get(tag, 0) + 1

    # ------------------------------------------------------------ results
    def layer_results(self) -> Dict:
        layers = []
        total, count = 0.0, 0
        for name, _ in self.modules:
            n = self.counts.get(name, 0)
            s = self.sums.get(name)
            per_head = (s / max(n, 1)).tolist() if s is not None else []
            mean = float(s.sum() / max(n, 1) / s.numel()) if s is not None else float("nan")
            layers.append({"layer": name, "mean_gate": mean, "tokens": n,
                           "per_head": per_head if len(per_head) > 1 else None})
            if n:
                total += mean * n
                count += n
        return {"layers": layers, "sentences": self.sentences,
                "mean_gate": total / count if count else float("nan")}

    def pos_results(self) -> Dict:
        tags = sorted(self.pos_counts)
        by_layer = OrderedDict()
        for name, per_tag in self.pos_sums.items():
            by_layer[name] = {t: per_tag[t] / self.pos_counts[t] for t in tags}
        return {"tags": [{"tag": t, "words": self.pos_counts[t]} for t in tags],
                "mean_gate": by_layer}


def read_pos_tags(path: str) -> List[List[str]]:
    if not os.path.exists(path):
        raise GateAnalysisError(f"--pos-tags {path}: no such file")
    with open(path, encoding="utf-8") as f:
        return [line.split() for line in f]


def collect_gates(path: str, data: str, split: str = "valid", max_tokens: int = 4000,
                  batch_size: Optional[int] = None, pos_tags: Optional[str] = None,
                  separator: str = "@@", cpu: bool = False) -> GateCollector:
    """Run a checkpoint over ``split`` of ``data`` and collect its gates."""
    import ctx_fairseq  # noqa: F401  (registers the model, allow-lists checkpoints)
    from fairseq import utils

    from ctx_fairseq.eval.checkpoints import restore_checkpoint

    if not os.path.exists(path):
        raise GateAnalysisError(f"--path {path}: no such checkpoint")
    tags = read_pos_tags(pos_tags) if pos_tags else None
    model, task, _cfg = restore_checkpoint(path, data, device="cpu" if cpu else "auto")
    use_cuda = next(model.parameters()).is_cuda
    task.load_dataset(split)
    dataset = task.dataset(split)
    collector = GateCollector(model, task.source_dictionary, tags, pos_tags or "", separator)
    itr = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)
    with torch.no_grad(), collector:
        for sample in itr:
            if not sample or "net_input" not in sample:
                continue
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            net = sample["net_input"]
            if collector.needs_decoder:
                model(**net)
            else:
                model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            collector.add_batch(sample)
    if tags is not None and len(tags) != len(dataset):
        raise GateAnalysisError(
            f"{pos_tags}: has {len(tags)} lines but split {split!r} has {len(dataset)} "
            f"sentences; expected one tag line per source sentence")
    return collector


# ------------------------------------------------------------------ output
def _write_atomic(path: str, text: str) -> None:
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".part", path)


def _savefig_atomic(fig, path: str, **kw) -> None:
    part = path + ".part.png"
    fig.savefig(part, **kw)
    os.replace(part, path)


def write_layer_outputs(res: Dict, out_dir: str, prefix: str = LAYER_PREFIX) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"{prefix}.{ext}") for ext in ("tsv", "json", "png")}
    tsv = ["layer\tmean_gate\ttokens\tper_head"]
    for r in res["layers"]:
        heads = ",".join(f"{h:.4f}" for h in r["per_head"]) if r["per_head"] else "-"
        tsv.append(f"{r['layer']}\t{r['mean_gate']:.6f}\t{r['tokens']}\t{heads}")
    tsv.append(f"all\t{res['mean_gate']:.6f}\t{sum(r['tokens'] for r in res['layers'])}\t-")
    _write_atomic(paths["tsv"], "\n".join(tsv) + "\n")
    _write_atomic(paths["json"], json.dumps(res, indent=2))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.8 * len(res["layers"])), 3.5))
    names = [r["layer"] for r in res["layers"]]
    ax.bar(names, [r["mean_gate"] for r in res["layers"]], color="tab:red")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean gate g (weight of local pattern)")
    ax.set_title(f"Local-pattern weight per layer ({res.get('split', '')})")
    fig.tight_layout()
    _savefig_atomic(fig, paths["png"], dpi=100)
    plt.close(fig)
    return paths


def write_pos_outputs(res: Dict, out_dir: str, layer: Optional[str] = None,
                      prefix: str = POS_PREFIX) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"{prefix}.{ext}") for ext in ("tsv", "json", "png")}
    layers = list(res["mean_gate"])
    if layer is None:
        layer = layers[0]
    if layer not in res["mean_gate"]:
        raise GateAnalysisError(
            f"--pos-layer {layer}: not a gated hybrid encoder layer; expected one of "
            f"{', '.join(layers)}")
    res = dict(res, plotted_layer=layer)
    tsv = ["tag\twords\t" + "\t".join(layers)]
    for t in res["tags"]:
        vals = "\t".join(f"{res['mean_gate'][n][t['tag']]:.6f}" for n in layers)
        tsv.append(f"{t['tag']}\t{t['words']}\t{vals}")
    _write_atomic(paths["tsv"], "\n".join(tsv) + "\n")
    _write_atomic(paths["json"], json.dumps(res, indent=2))
    plt = pyplot()
    values = res["mean_gate"][layer]
    order = sorted(values, key=values.get)
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.6 * len(order)), 3.5))
    ax.bar(order, [values[t] for t in order], color="tab:blue")
    ax.set_ylabel("mean gate g")
    ax.set_title(f"Local-pattern weight by part of speech ({layer})")
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    _savefig_atomic(fig, paths["png"], dpi=100)
    plt.close(fig)
    return paths


# ---------------------------------------------------------------------- CLI
def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctx-hybrid-gates",
        description="Mean gate (local-pattern weight, Eq. 5) of a transformer_hybrid "
                    "checkpoint per layer (Fig. 3) and, with --pos-tags, by part of "
                    "speech (Fig. 4). For the window sweep (Fig. 2) run "
                    "'python -m ctx_fairseq.eval.analyses.hybrid_gates sweep --help'.")
    p.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    p.add_argument("--path", required=True, help="transformer_hybrid checkpoint (gate mode)")
    p.add_argument("--split", default="valid", help="binarized split (default: valid)")
    p.add_argument("--pos-tags", default=None, metavar="FILE",
                   help="one line per sentence of the split, one tag per source word")
    p.add_argument("--pos-layer", default=None, metavar="LAYER",
                   help="layer to plot by POS, e.g. encoder.1 (default: the first)")
    p.add_argument("--bpe-separator", default="@@",
                   help="subword continuation marker (default: '@@', subword-nmt)")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--out-dir", default=".", help="where to write the TSV/JSON/PNG files")
    p.add_argument("--cpu", action="store_true", help="do not use a GPU")
    return p


def cli_main(argv: Optional[List[str]] = None) -> Dict[str, str]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sweep":
        return sweep_cli_main(argv[1:])
    args = get_parser().parse_args(argv)
    try:
        col = collect_gates(args.path, args.data, args.split, args.max_tokens,
                            args.batch_size, args.pos_tags, args.bpe_separator, args.cpu)
        res = col.layer_results()
        res.update(path=args.path, split=args.split)
        paths = {f"layers.{k}": v for k, v in write_layer_outputs(res, args.out_dir).items()}
        for r in res["layers"]:
            print(f"{r['layer']}\tmean gate {r['mean_gate']:.4f}\t({r['tokens']} tokens)")
        if args.pos_tags:
            pos = col.pos_results()
            pos.update(path=args.path, split=args.split, pos_tags=args.pos_tags)
            paths.update({f"pos.{k}": v for k, v in
                          write_pos_outputs(pos, args.out_dir, args.pos_layer).items()})
    except GateAnalysisError as e:
        raise SystemExit(f"ctx-hybrid-gates: error: {e}")
    print_written(paths.values())
    return paths


# -------------------------------------------------------------------- sweep
BLEU_FILE = "bleu.json"


def run_scores(run_dir: str) -> Dict:
    """The BLEU of a run as the recipes score a model (``sent_py evaluate`` of
    recipes/lib/steps_sentence.sh, run by ``recipes/hybrid_window_sweep.sh``):
    ``run_dir/bleu.json`` holds sacreBLEU (of the detokenised hypotheses against
    the untokenised reference file) and, where asked for, tokenized BLEU (the
    tokenised hypotheses against the tokenised reference file, sacreBLEU
    --tokenize none), each with its signature. Never the generate output's T-
    lines (fairseq's detokenised references: ``<unk>`` where the dictionary
    lacked a word)."""
    path = os.path.join(run_dir, BLEU_FILE)
    if not os.path.exists(path):
        raise GateAnalysisError(
            f"{path}: missing; score the run's translation against its reference file "
            f"first (recipes/hybrid_window_sweep.sh does: the recipes' evaluation)")
    try:
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
        sb = res["sacrebleu"]
        out = {"sacrebleu": float(sb["score"]), "sacrebleu_signature": str(sb["signature"]),
               "reference": res.get("reference"), "checkpoint": res.get("checkpoint"),
               "sentences": res.get("sentences"),
               "tokenized_bleu": None, "tokenized_bleu_signature": None,
               "tokenized_bleu_label": None, "tokenized_reference": None}
        tok = res.get("tokenized_bleu")
        if tok is not None:
            out.update(tokenized_bleu=float(tok["score"]),
                       tokenized_bleu_signature=str(tok["signature"]),
                       tokenized_bleu_label=str(tok.get("label") or "tokenized BLEU"),
                       tokenized_reference=res.get("tokenized_reference") or tok.get("reference"))
    except (ValueError, KeyError, TypeError) as e:
        raise GateAnalysisError(
            f"{path}: not a BLEU result of the recipes' evaluation (sacrebleu.score and "
            f".signature expected): {type(e).__name__}: {e}") from None
    return out


def _one(rows: List[Dict], key: str, what: str) -> Optional[str]:
    values = sorted({str(r[key]) for r in rows})
    if len(values) > 1:
        raise GateAnalysisError(
            f"the runs differ in {what} ({'; '.join(values)}): their BLEU scores are not "
            f"comparable in one figure")
    return rows[0][key]


def sweep_results(runs: Iterable[str]) -> Dict:
    rows = []
    for spec in runs:
        if "=" not in spec:
            raise GateAnalysisError(
                f"run {spec!r}: expected M=DIR (window m and the directory holding "
                f"{BLEU_FILE} and {LAYER_PREFIX}.json)")
        m_s, run_dir = spec.split("=", 1)
        try:
            m = int(m_s)
        except ValueError:
            raise GateAnalysisError(f"run {spec!r}: window {m_s!r} is not an integer")
        layer_json = os.path.join(run_dir, f"{LAYER_PREFIX}.json")
        if not os.path.exists(layer_json):
            raise GateAnalysisError(f"{layer_json}: missing; run ctx-hybrid-gates "
                                    f"--out-dir {run_dir} first")
        with open(layer_json, encoding="utf-8") as f:
            gates = json.load(f)
        rows.append({"window": m, "window_size": 2 * m + 1, **run_scores(run_dir),
                     "mean_gate": gates["mean_gate"],
                     "per_layer": {r["layer"]: r["mean_gate"] for r in gates["layers"]},
                     "dir": run_dir})
    if not rows:
        raise GateAnalysisError("no runs given; expected M=DIR arguments")
    if len({r["window"] for r in rows}) != len(rows):
        raise GateAnalysisError("a window m is given twice")
    rows.sort(key=lambda r: r["window"])
    has_tok = {r["tokenized_bleu"] is not None for r in rows}
    if len(has_tok) > 1:
        raise GateAnalysisError(
            "some runs have a tokenized BLEU and others not: "
            + ", ".join(f"m={r['window']}: {'yes' if r['tokenized_bleu'] is not None else 'no'}"
                        for r in rows))
    res = {"runs": rows,
           "sacrebleu_signature": _one(rows, "sacrebleu_signature", "sacreBLEU signature"),
           "tokenized_bleu_signature": None, "tokenized_bleu_label": None}
    if True in has_tok:
        res["tokenized_bleu_signature"] = _one(rows, "tokenized_bleu_signature",
                                               "tokenized BLEU signature")
        res["tokenized_bleu_label"] = _one(rows, "tokenized_bleu_label", "tokenized BLEU label")
    # the figure's bars: the paper's metric (tokenized BLEU) where there is one
    res["plotted"] = "tokenized_bleu" if True in has_tok else "sacrebleu"
    return res


def _metric_name(res: Dict, key: str) -> str:
    if key == "tokenized_bleu":
        return f"tokenized BLEU ({res['tokenized_bleu_label']})"
    return "sacreBLEU"


def write_sweep_outputs(res: Dict, out_dir: str, prefix: str = SWEEP_PREFIX) -> Dict[str, str]:
    """PREFIX.{tsv,json,md,png}, each complete or not at all. The TSV's BLEU
    columns are named by metric; the Markdown table and the figure name the
    metric and give its sacreBLEU signature."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"{prefix}.{ext}") for ext in ("tsv", "json", "md", "png")}
    tok = res["tokenized_bleu_signature"] is not None

    def num(v):
        return "-" if v is None else f"{v:.2f}"

    tsv = ["m\twindow_size\tsacrebleu\ttokenized_bleu\tmean_gate"]
    for r in res["runs"]:
        tsv.append(f"{r['window']}\t{r['window_size']}\t{num(r['sacrebleu'])}\t"
                   f"{num(r['tokenized_bleu'])}\t{r['mean_gate']:.6f}")
    _write_atomic(paths["tsv"], "\n".join(tsv) + "\n")
    md = ["# Window sweep (hybrid paper Fig. 2)", "",
          "| m | window size 2m+1 | sacreBLEU |"
          + (f" {_metric_name(res, 'tokenized_bleu')} |" if tok else "") + " mean gate |",
          "|---:|---:|---:|" + ("---:|" if tok else "") + "---:|"]
    for r in res["runs"]:
        md.append(f"| {r['window']} | {r['window_size']} | {num(r['sacrebleu'])} |"
                  + (f" {num(r['tokenized_bleu'])} |" if tok else "") + f" {r['mean_gate']:.4f} |")
    md += ["", f"sacreBLEU: the detokenised hypotheses against the untokenised reference file "
               f"({res['runs'][0]['reference']}); signature `{res['sacrebleu_signature']}`"]
    if tok:
        md += ["", f"{_metric_name(res, 'tokenized_bleu')}: the tokenised hypotheses against the "
                   f"tokenised reference file ({res['runs'][0]['tokenized_reference']}), "
                   f"case-sensitive; signature `{res['tokenized_bleu_signature']}`"]
    md += ["", "Mean gate: the weight of the local pattern (Eq. 5) averaged over the gated "
               "layers and the split's tokens.", ""]
    _write_atomic(paths["md"], "\n".join(md))
    _write_atomic(paths["json"], json.dumps(res, indent=2) + "\n")
    key = res["plotted"]
    sig = res[f"{key}_signature"]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    labels = [str(r["window_size"]) for r in res["runs"]]
    ax.bar(labels, [r[key] for r in res["runs"]], color="tab:blue", alpha=0.7)
    ax.set_xlabel("window size 2m+1")
    ax.set_ylabel(_metric_name(res, key))
    ax2 = ax.twinx()
    ax2.plot(labels, [r["mean_gate"] for r in res["runs"]], color="tab:red", marker="o")
    ax2.set_ylabel("mean gate (local weight)")
    ax.set_title("Window size sweep")
    fig.text(0.01, 0.01, sig, fontsize=5, color="grey")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _savefig_atomic(fig, paths["png"], dpi=100)
    plt.close(fig)
    return paths


def sweep_cli_main(argv: Optional[List[str]] = None) -> Dict[str, str]:
    p = argparse.ArgumentParser(
        prog="ctx-hybrid-gates sweep",
        description="Fig. 2: BLEU and mean gate of runs trained with different "
                    "--hybrid-window m. Each DIR holds the run's bleu.json (the recipes' "
                    "scoring against the reference files, as recipes/hybrid_window_sweep.sh "
                    "writes it) and the per-layer gate JSON of ctx-hybrid-gates.")
    p.add_argument("runs", nargs="+", metavar="M=DIR")
    p.add_argument("--out-dir", default=".")
    args = p.parse_args(argv)
    try:
        res = sweep_results(args.runs)
        paths = write_sweep_outputs(res, args.out_dir)
    except GateAnalysisError as e:
        raise SystemExit(f"ctx-hybrid-gates sweep: error: {e}")
    for r in res["runs"]:
        tok = ("" if r["tokenized_bleu"] is None else
               f"\t{_metric_name(res, 'tokenized_bleu')} {r['tokenized_bleu']:.2f}")
        print(f"m={r['window']}\tsacreBLEU {r['sacrebleu']:.2f}{tok}\t"
              f"mean gate {r['mean_gate']:.4f}")
    print(f"sacreBLEU signature: {res['sacrebleu_signature']}")
    if res["tokenized_bleu_signature"]:
        print(f"tokenized BLEU signature: {res['tokenized_bleu_signature']}")
    print_written(paths.values())
    return paths


if __name__ == "__main__":
    cli_main()
