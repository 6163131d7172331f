"""Linguistic probing of a frozen NMT encoder (Conneau et al. 2018, "What you
can cram into a single vector"), as in Ampomah et al. (2021, Sec. 7.1,
Table 4) and Xu et al. (2019, Sec. 5.1, Table 3).

``ctx-probe run`` freezes a checkpoint's encoder, represents each sentence by
the mean of its last encoder layer, and trains a small classifier per
probing task on those fixed vectors:

* features: ``encoder_out["encoder_out"][0]`` (``T x B x C``) of the encoder in
  eval mode, without gradients, averaged over the non-pad positions. The
  final ``</s>`` is included: it is part of every source the encoder saw in
  training. Features are computed once per task and kept in memory.
* classifier (Conneau et al.'s MLP as in SentEval): ``Linear(C, hidden) ->
  Dropout -> Sigmoid -> Linear(hidden, classes)``, ``--hidden 50``,
  ``--dropout 0``; ``--hidden 0`` gives logistic regression. L2 ``1e-4`` on the
  hidden layer's weight matrix only (as weight decay), RMSprop with learning
  rate ``2.5e-4``, mini-batches of 64, at most 100 epochs (Ampomah et al.);
  early stopping on the ``va`` accuracy: training stops after ``--patience 20``
  epochs without a strictly better ``va`` accuracy (SentEval's ``tenacity``
  5 checks x ``epoch_size`` 4 passes) and the parameters of the best ``va``
  epoch are scored on ``te``. The classifier runs on the CPU and is
  deterministic for ``--seed``.
* baseline: the majority class of the ``tr`` split, scored on ``te``.

Input: SentEval probing files, one example per line,
``tr|va|te<TAB>label<TAB>sentence`` (exactly three fields; blank lines are
skipped). A task is named after its file (``sentence_length.txt`` ->
``sentence_length``); ``--task-file`` may be repeated and may name a directory
(every ``*.txt`` in it). Sentences are turned into the model's units by
:mod:`ctx_fairseq.eval.text_units` (fairseq's ``--tokenizer`` / ``--bpe``,
falling back to the checkpoint's); the share of ``<unk>`` tokens is reported.

Document-level checkpoints (``--task document_translation`` with context)
are refused: their encoder was trained to read a sentence together with its
document context, and probing files hold single sentences without documents.

``ctx-probe generate`` writes SentLen, WC and BShift files from any
tokenized monolingual text (whitespace words), following Conneau et al.
where the data allows:

* every task samples *distinct* sentences with ``--min-words`` <= words <=
  ``--max-words`` (default 5-28, Conneau et al.'s corpus); a sentence is used
  at most once per task, so no sentence is in two splits;
* classes are balanced: every class gets the same number of sentences (the
  smallest available, capped by ``--sizes``); a class with fewer than
  ``--min-per-class`` sentences is left out with a note; fewer than two classes
  left is an error naming the text and the options to change;
* ``--sizes 100000,10000,10000`` caps tr/va/te (Conneau et al.'s sizes); with
  fewer examples all are used, split in the same proportions;
* SentLen: ``--sentlen-bins 6`` equal-width length bins over the observed
  lengths (one bin per length when fewer lengths occur); labels are the
  bins' word ranges (``5-8``, or ``7`` for a one-length bin);
* WC: the ``--wc-words 1000`` words of frequency ranks ``--wc-rank-start
  2000`` onward (0-based; ties broken alphabetically; punctuation never
  counts as a word); sentences that contain exactly one occurrence of
  exactly one of them; the label is that word;
* BShift: two adjacent words swapped (label ``I``) or the sentence intact
  (``O``); only sentences that can be swapped are used, each either intact or
  inverted; the swapped words are different and not punctuation, and the
  result is not itself a sentence of the text.

Files: ``sentence_length.txt``, ``word_content.txt``, ``bigram_shift.txt``
(SentEval's names), ordered tr, va, te and shuffled within each split, plus
``probe_data.json`` (options, classes, sizes, notes). Nothing is written when
a requested task cannot be built.

Command line (``ctx-probe``, or ``python -m ctx_fairseq.eval.analyses.probe``)::

    ctx-probe generate --text corpus.tok.en --out-dir probing/ --tasks sentlen,wc,bshift
    ctx-probe run --path checkpoint_best.pt --data data-bin/ --task-file probing/ \
        --out-dir probe_out/

``run`` prints the table and writes ``probe_out/probe.{md,json,png}``. See
``docs/probe.md`` for the choices and measured figures.
"""

import argparse
import collections
import copy
import json
import os
import random
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["ProbeError", "ProbingTask", "read_probing_file", "collect_task_files",
           "GeneratedTask", "read_text", "make_sentlen", "make_wc", "make_bshift",
           "generate_tasks", "write_generated", "ProbeSettings", "ProbeClassifier",
           "train_probe", "majority_baseline", "sentence_features", "load_probe_model",
           "probe_checkpoint", "format_table", "write_outputs", "main", "cli_main"]

SPLITS = ("tr", "va", "te")
GENERATORS = ("sentlen", "wc", "bshift")
TASK_FILES = {"sentlen": "sentence_length.txt", "wc": "word_content.txt",
              "bshift": "bigram_shift.txt"}
MANIFEST = "probe_data.json"


class ProbeError(ValueError):
    """A bad probing file, text, option or checkpoint (the message says which)."""


# --------------------------------------------------------------------------
# probing files
# --------------------------------------------------------------------------

@dataclass
class ProbingTask:
    """One probing file: ``examples[split]`` is a list of
    ``(label, sentence, line_number)`` (1-based line numbers)."""
    name: str
    path: str
    examples: Dict[str, List[Tuple[str, str, int]]]

    def labels(self, split: str) -> List[str]:
        return [lab for lab, _, _ in self.examples[split]]

    def sizes(self) -> Dict[str, int]:
        return {s: len(self.examples[s]) for s in SPLITS}


def read_probing_file(path: str) -> ProbingTask:
    """Read ``tr|va|te<TAB>label<TAB>sentence`` lines; raise :class:`ProbeError`
    naming the file and line on anything else."""
    if not os.path.isfile(path):
        raise ProbeError(f"{path}: no such probing file")
    examples: Dict[str, List[Tuple[str, str, int]]] = {s: [] for s in SPLITS}
    with open(path, encoding="utf-8") as f:
        for no, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ProbeError(f"{path}:{no}: expected 3 tab-separated fields "
                                 f"(tr|va|te, label, sentence), got {len(fields)}")
            split, label, sentence = fields
            if split not in examples:
                raise ProbeError(f"{path}:{no}: unknown split tag {split!r} "
                                 f"(expected one of tr, va, te)")
            if not label.strip():
                raise ProbeError(f"{path}:{no}: empty label")
            if not sentence.strip():
                raise ProbeError(f"{path}:{no}: empty sentence")
            examples[split].append((label.strip(), " ".join(sentence.split()), no))
    if not any(examples.values()):
        raise ProbeError(f"{path}: empty probing file (no examples)")
    for split, role in (("tr", "training"), ("va", "early stopping"), ("te", "testing")):
        if not examples[split]:
            raise ProbeError(f"{path}: no {split!r} examples (the {split} split is needed "
                             f"for {role})")
    train_labels = set(lab for lab, _, _ in examples["tr"])
    if len(train_labels) < 2:
        raise ProbeError(f"{path}: the tr split has a single label {next(iter(train_labels))!r}; "
                         "a probing task needs at least two classes")
    for split in ("va", "te"):
        for lab, _, no in examples[split]:
            if lab not in train_labels:
                raise ProbeError(f"{path}:{no}: label {lab!r} of the {split} split does not "
                                 "occur in the tr split")
    name = os.path.splitext(os.path.basename(path))[0]
    return ProbingTask(name, path, examples)


def collect_task_files(specs: Sequence[str]) -> List[str]:
    """``--task-file`` values (files, or directories holding ``*.txt``) to files."""
    paths: List[str] = []
    for spec in specs:
        if os.path.isdir(spec):
            found = sorted(os.path.join(spec, n) for n in os.listdir(spec)
                           if n.endswith(".txt") and os.path.isfile(os.path.join(spec, n)))
            if not found:
                raise ProbeError(f"--task-file {spec}: directory without *.txt probing files")
            paths.extend(found)
        elif os.path.isfile(spec):
            paths.append(spec)
        else:
            raise ProbeError(f"--task-file {spec}: no such file or directory")
    names: Dict[str, str] = {}
    for p in paths:
        name = os.path.splitext(os.path.basename(p))[0]
        if name in names:
            raise ProbeError(f"--task-file: two files name the task {name!r}: {names[name]} "
                             f"and {p}")
        names[name] = p
    return paths


# --------------------------------------------------------------------------
# generation from monolingual text
# --------------------------------------------------------------------------

def is_punct(token: str) -> bool:
    return all(unicodedata.category(ch).startswith("P") for ch in token)


@dataclass
class GeneratedTask:
    key: str  # sentlen / wc / bshift
    filename: str
    examples: Dict[str, List[Tuple[str, str]]]  # split -> (label, sentence)
    info: Dict = field(default_factory=dict)

    def lines(self) -> List[str]:
        return [f"{s}\t{lab}\t{sent}" for s in SPLITS for lab, sent in self.examples[s]]


@dataclass
class Text:
    """Monolingual text: every kept line (``lines``, for word frequencies) and
    the distinct sentences (``distinct``, sorted), as whitespace tokens."""
    paths: List[str]
    lines: List[Tuple[str, ...]]
    distinct: List[Tuple[str, ...]]

    @property
    def name(self) -> str:
        return ", ".join(self.paths)


def read_text(paths: Sequence[str], min_words: int = 5, max_words: int = 28) -> Text:
    if min_words < 1 or max_words < min_words:
        raise ProbeError(f"--min-words {min_words} --max-words {max_words}: expected "
                         "1 <= min <= max")
    lines: List[Tuple[str, ...]] = []
    total = 0
    for p in paths:
        if not os.path.isfile(p):
            raise ProbeError(f"--text {p}: no such file")
        with open(p, encoding="utf-8") as f:
            for raw in f:
                toks = tuple(raw.split())
                if not toks:
                    continue
                total += 1
                if min_words <= len(toks) <= max_words:
                    lines.append(toks)
    name = ", ".join(paths)
    if not total:
        raise ProbeError(f"--text {name}: no sentences (empty text)")
    if not lines:
        raise ProbeError(f"--text {name}: none of its {total} sentences has "
                         f"{min_words}-{max_words} words (--min-words / --max-words)")
    return Text(list(paths), lines, sorted(set(lines)))


def _split_sizes(per_class: int, sizes: Sequence[int]) -> Tuple[int, int, int]:
    total = sum(sizes)
    n_va = round(per_class * sizes[1] / total)
    n_te = round(per_class * sizes[2] / total)
    return per_class - n_va - n_te, n_va, n_te


def balanced_splits(task: str, text: Text, pools: Dict[str, List[str]], sizes: Sequence[int],
                    min_per_class: int, rng: random.Random,
                    hint: str = "") -> Tuple[Dict[str, List[Tuple[str, str]]], Dict]:
    """Balanced tr/va/te from disjoint per-class pools of sentences.

    Classes with fewer than ``min_per_class`` sentences are left out (noted);
    every kept class gets ``per_class`` sentences, split in the proportions of
    ``sizes``."""
    notes: List[str] = []
    kept = {lab: pool for lab, pool in pools.items() if len(pool) >= min_per_class}
    small = sorted(lab for lab in pools if lab not in kept)
    if small:
        shown = ", ".join(f"{lab} ({len(pools[lab])})" for lab in small[:10])
        more = f" and {len(small) - 10} more" if len(small) > 10 else ""
        notes.append(f"{len(small)} of {len(pools)} classes have fewer than --min-per-class "
                     f"{min_per_class} sentences and are left out: {shown}{more}")
    if len(kept) < 2:
        avail = ", ".join(f"{lab}: {len(p)}" for lab, p in sorted(pools.items())[:10]) or "none"
        raise ProbeError(f"{task} cannot be built from {text.name}: {len(kept)} class(es) with "
                         f"at least --min-per-class {min_per_class} distinct sentences, need 2 "
                         f"(sentences per class: {avail}){hint}")
    cap = sum(sizes) // len(kept)
    per_class = min(min(len(p) for p in kept.values()), cap)
    n_tr, n_va, n_te = _split_sizes(per_class, sizes)
    if per_class < min_per_class or min(n_tr, n_va, n_te) < 1:
        raise ProbeError(f"{task}: --sizes {','.join(map(str, sizes))} leaves {per_class} "
                         f"sentences per class for {len(kept)} classes (tr/va/te "
                         f"{n_tr}/{n_va}/{n_te}); give larger --sizes")
    splits: Dict[str, List[Tuple[str, str]]] = {s: [] for s in SPLITS}
    for lab in sorted(kept):
        pool = sorted(kept[lab])
        rng.shuffle(pool)
        chosen = pool[:per_class]
        splits["tr"] += [(lab, s) for s in chosen[:n_tr]]
        splits["va"] += [(lab, s) for s in chosen[n_tr:n_tr + n_va]]
        splits["te"] += [(lab, s) for s in chosen[n_tr + n_va:]]
    for s in SPLITS:
        rng.shuffle(splits[s])
    info = {"classes": sorted(kept), "per_class": per_class,
            "sizes": {s: len(splits[s]) for s in SPLITS},
            "available": {lab: len(p) for lab, p in sorted(pools.items())}, "notes": notes}
    return splits, info


def sentlen_bins(lengths: Sequence[int], n_bins: int) -> List[Tuple[int, int]]:
    """Equal-width bins ``(lo, hi)`` (inclusive) over ``min..max`` of ``lengths``;
    one bin per length when the range has fewer lengths than ``n_bins``."""
    lo, hi = min(lengths), max(lengths)
    n = hi - lo + 1
    if n <= n_bins:
        return [(k, k) for k in range(lo, hi + 1)]
    return [(lo + k * n // n_bins, lo + (k + 1) * n // n_bins - 1) for k in range(n_bins)]


def bin_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def make_sentlen(text: Text, n_bins: int = 6, sizes=(100000, 10000, 10000),
                 min_per_class: int = 50, seed: int = 1) -> GeneratedTask:
    if n_bins < 2:
        raise ProbeError(f"--sentlen-bins {n_bins}: expected at least 2")
    lengths = sorted({len(t) for t in text.distinct})
    if len(lengths) < 2:
        raise ProbeError(f"SentLen cannot be built from {text.name}: every sentence has "
                         f"{lengths[0]} words")
    bins = sentlen_bins(lengths, n_bins)
    pools: Dict[str, List[str]] = {bin_label(lo, hi): [] for lo, hi in bins}
    for toks in text.distinct:
        for lo, hi in bins:
            if lo <= len(toks) <= hi:
                pools[bin_label(lo, hi)].append(" ".join(toks))
    rng = random.Random(f"ctx-probe:{seed}:sentlen")
    splits, info = balanced_splits("SentLen", text, pools, sizes, min_per_class, rng)
    if len(bins) < n_bins:
        info["notes"].insert(0, f"only {len(bins)} sentence lengths ({lengths[0]}-{lengths[-1]} "
                                f"words) for --sentlen-bins {n_bins}: one bin per length")
    info["bins"] = [[lo, hi] for lo, hi in bins]
    return GeneratedTask("sentlen", TASK_FILES["sentlen"], splits, info)


def word_ranks(text: Text) -> List[Tuple[str, int]]:
    """Words (punctuation excluded) by frequency over all kept lines, most
    frequent first, ties alphabetical."""
    counts = collections.Counter(w for toks in text.lines for w in toks if not is_punct(w))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def make_wc(text: Text, n_words: int = 1000, rank_start: int = 2000,
            sizes=(100000, 10000, 10000), min_per_class: int = 50,
            seed: int = 1) -> GeneratedTask:
    if n_words < 2 or rank_start < 0:
        raise ProbeError(f"--wc-words {n_words} --wc-rank-start {rank_start}: expected "
                         "at least 2 words from a rank >= 0")
    ranked = word_ranks(text)
    need = rank_start + n_words
    if len(ranked) < need:
        raise ProbeError(
            f"WC cannot be built from {text.name}: it has {len(ranked)} distinct words "
            f"(punctuation excluded), and --wc-rank-start {rank_start} --wc-words {n_words} "
            f"needs {need} (Conneau et al.: ranks 2000-2999 of a large corpus); give a smaller "
            "--wc-rank-start/--wc-words, or leave wc out of --tasks")
    targets = [w for w, _ in ranked[rank_start:need]]
    target_set = set(targets)
    pools: Dict[str, List[str]] = {w: [] for w in targets}
    for toks in text.distinct:
        hits = [w for w in toks if w in target_set]
        if len(hits) == 1:
            pools[hits[0]].append(" ".join(toks))
    rng = random.Random(f"ctx-probe:{seed}:wc")
    hint = ("; lower --min-per-class or choose other ranks (--wc-rank-start, --wc-words), "
            "or leave wc out of --tasks")
    splits, info = balanced_splits("WC", text, pools, sizes, min_per_class, rng, hint)
    info["words"] = targets
    info["ranks"] = [rank_start, need - 1]
    return GeneratedTask("wc", TASK_FILES["wc"], splits, info)


def swap_positions(toks: Sequence[str], attested: set) -> List[int]:
    """Positions ``i`` where swapping ``toks[i]`` and ``toks[i+1]`` is allowed:
    two different non-punctuation words, and the result not in ``attested``."""
    out = []
    for i in range(len(toks) - 1):
        a, b = toks[i], toks[i + 1]
        if a == b or is_punct(a) or is_punct(b):
            continue
        swapped = tuple(toks[:i]) + (b, a) + tuple(toks[i + 2:])
        if swapped not in attested:
            out.append(i)
    return out


def swap(toks: Sequence[str], i: int) -> Tuple[str, ...]:
    toks = list(toks)
    toks[i], toks[i + 1] = toks[i + 1], toks[i]
    return tuple(toks)


def make_bshift(text: Text, sizes=(100000, 10000, 10000), min_per_class: int = 50,
                seed: int = 1) -> GeneratedTask:
    attested = set(text.distinct)
    candidates = [(toks, pos) for toks in text.distinct
                  for pos in [swap_positions(toks, attested)] if pos]
    rng = random.Random(f"ctx-probe:{seed}:bshift")
    rng.shuffle(candidates)
    half = len(candidates) // 2
    intact = [" ".join(toks) for toks, _ in candidates[:half]]
    inverted, seen = [], set()
    for toks, pos in candidates[half:2 * half]:
        s = " ".join(swap(toks, rng.choice(pos)))
        if s not in seen:
            seen.add(s)
            inverted.append(s)
    hint = (f" ({len(candidates)} of {len(text.distinct)} distinct sentences have two adjacent "
            "different non-punctuation words to swap)")
    splits, info = balanced_splits("BShift", text, {"O": intact, "I": inverted}, sizes,
                                   min_per_class, rng, hint)
    info["swappable"] = len(candidates)
    return GeneratedTask("bshift", TASK_FILES["bshift"], splits, info)


def generate_tasks(text: Text, tasks: Sequence[str], seed: int = 1,
                   sizes=(100000, 10000, 10000), min_per_class: int = 50,
                   sentlen_bins_n: int = 6, wc_words: int = 1000,
                   wc_rank_start: int = 2000) -> Dict[str, GeneratedTask]:
    """Build every task in ``tasks``; raise :class:`ProbeError` listing every
    task that cannot be built."""
    if len(sizes) != 3 or min(sizes) < 1:
        raise ProbeError(f"--sizes {sizes}: expected three positive numbers TR,VA,TE")
    if min_per_class < 3:
        raise ProbeError(f"--min-per-class {min_per_class}: expected at least 3 (one "
                         "sentence per split)")
    out, errors = {}, []
    for key in tasks:
        try:
            if key == "sentlen":
                out[key] = make_sentlen(text, sentlen_bins_n, sizes, min_per_class, seed)
            elif key == "wc":
                out[key] = make_wc(text, wc_words, wc_rank_start, sizes, min_per_class, seed)
            elif key == "bshift":
                out[key] = make_bshift(text, sizes, min_per_class, seed)
            else:
                raise ProbeError(f"--tasks: unknown task {key!r} (expected "
                                 f"{', '.join(GENERATORS)})")
        except ProbeError as e:
            errors.append(str(e))
    if errors:
        raise ProbeError("; ".join(errors) + " (nothing written)")
    return out


def write_generated(out_dir: str, generated: Dict[str, GeneratedTask], manifest: Dict) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for task in generated.values():
        path = os.path.join(out_dir, task.filename)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(task.lines()) + "\n")
        os.replace(tmp, path)
        written.append(path)
    path = os.path.join(out_dir, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    written.append(path)
    return written


# --------------------------------------------------------------------------
# the classifier
# --------------------------------------------------------------------------

@dataclass
class ProbeSettings:
    hidden: int = 50
    dropout: float = 0.0
    l2: float = 1e-4
    lr: float = 2.5e-4
    batch_size: int = 64
    max_epochs: int = 100
    patience: int = 20
    seed: int = 1

    def check(self) -> None:
        if self.hidden < 0 or not 0.0 <= self.dropout < 1.0 or self.l2 < 0 or self.lr <= 0:
            raise ProbeError(f"classifier settings out of range: {self}")
        if self.batch_size < 1 or self.max_epochs < 1 or self.patience < 1:
            raise ProbeError("--batch-size, --max-epochs and --patience must be >= 1")


class ProbeClassifier(nn.Module):
    """Conneau et al.'s MLP (SentEval): Linear -> Dropout -> Sigmoid -> Linear;
    ``hidden=0``: a single linear layer (logistic regression)."""

    def __init__(self, dim: int, n_classes: int, hidden: int = 50, dropout: float = 0.0):
        super().__init__()
        if hidden > 0:
            self.hidden = nn.Linear(dim, hidden)
            self.dropout = nn.Dropout(dropout)
            self.out = nn.Linear(hidden, n_classes)
        else:
            self.hidden = None
            self.out = nn.Linear(dim, n_classes)

    def regularized_weight(self) -> nn.Parameter:
        return self.hidden.weight if self.hidden is not None else self.out.weight

    def forward(self, x):
        if self.hidden is not None:
            x = torch.sigmoid(self.dropout(self.hidden(x)))
        return self.out(x)


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(x), batch):
        correct += int(model(x[i:i + batch]).argmax(-1).eq(y[i:i + batch]).sum())
    return correct / len(x)


def train_probe(feats: Dict[str, torch.Tensor], labels: Dict[str, torch.Tensor], n_classes: int,
                settings: ProbeSettings) -> Dict:
    """Train on ``tr``, stop early on ``va`` accuracy, score the best ``va``
    epoch on ``te``. Deterministic for ``settings.seed`` (global RNG state is
    left as it was)."""
    settings.check()
    x_tr, y_tr = feats["tr"].float().cpu(), labels["tr"].cpu()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = ProbeClassifier(x_tr.shape[1], n_classes, settings.hidden, settings.dropout)
        reg = model.regularized_weight()
        others = [p for p in model.parameters() if p is not reg]
        opt = torch.optim.RMSprop([{"params": [reg], "weight_decay": settings.l2},
                                   {"params": others, "weight_decay": 0.0}], lr=settings.lr)
        gen = torch.Generator().manual_seed(settings.seed)
        loss_fn = nn.CrossEntropyLoss()
        best_acc, best_state, best_epoch, bad, epoch = -1.0, None, 0, 0, 0
        history = []
        for epoch in range(1, settings.max_epochs + 1):
            model.train()
            perm = torch.randperm(len(x_tr), generator=gen)
            for i in range(0, len(perm), settings.batch_size):
                idx = perm[i:i + settings.batch_size]
                loss = loss_fn(model(x_tr[idx]), y_tr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            acc = _accuracy(model, feats["va"].float().cpu(), labels["va"].cpu())
            history.append(acc)
            if acc > best_acc:
                best_acc, best_state, best_epoch, bad = acc, copy.deepcopy(model.state_dict()), \
                    epoch, 0
            else:
                bad += 1
                if bad >= settings.patience:
                    break
        model.load_state_dict(best_state)
    return {"accuracy": _accuracy(model, feats["te"].float().cpu(), labels["te"].cpu()),
            "valid_accuracy": best_acc, "best_epoch": best_epoch, "epochs": epoch,
            "valid_history": history, "model": model}


def majority_baseline(train_labels: Sequence[str], test_labels: Sequence[str]) -> Tuple[str, float]:
    """The most frequent ``tr`` label (ties: the smallest) and its ``te`` accuracy."""
    counts = collections.Counter(train_labels)
    label = min(counts, key=lambda lab: (-counts[lab], lab))
    return label, sum(1 for lab in test_labels if lab == label) / len(test_labels)


# --------------------------------------------------------------------------
# the frozen encoder
# --------------------------------------------------------------------------

def load_probe_model(path: str, data: str, cpu: bool = True, random_init: bool = False,
                     seed: int = 1):
    """(model, task, cfg). ``random_init``: a model of the checkpoint's shape
    with fresh parameters (fairseq's initialisation, seeded), the untrained
    control."""
    from fairseq.models.transformer import TransformerEncoderBase

    from ctx_fairseq.eval.checkpoints import restore_checkpoint

    if not os.path.isfile(path):
        raise ProbeError(f"--path {path}: no such checkpoint")
    if not os.path.isdir(data):
        raise ProbeError(f"--data {data}: no such directory")
    model, task, cfg = restore_checkpoint(path, data)
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    if isinstance(task, DocumentTranslationTask) and task.uses_context:
        raise ProbeError(
            f"--path {path}: a document-level checkpoint (--task document_translation with "
            f"context: {', '.join(task.context_keys())}); its encoder was trained to read a "
            "sentence with its document context, and probing files hold single sentences "
            "without documents, so probing it would measure another model. Probe a "
            "sentence-level checkpoint (transformer, transformer_dc, transformer_hybrid)")
    if not isinstance(getattr(model, "encoder", None), TransformerEncoderBase):
        raise ProbeError(f"--path {path}: the encoder is {type(model.encoder).__name__}, not a "
                         "fairseq transformer encoder")
    if random_init:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = task.build_model(cfg.model)
    model.eval()
    if not cpu and torch.cuda.is_available():
        model = model.cuda()
    return model, task, cfg


@torch.no_grad()
def sentence_features(encoder, text_encoder, sentences: Sequence[str], where: Sequence[str],
                      left_pad: bool = True, batch_size: int = 128) -> torch.Tensor:
    """Mean of the last encoder layer over the non-pad positions (``</s>``
    included) of each sentence; ``where[i]`` (``file:line``) names sentence
    ``i`` in errors. Returns ``N x C`` on the CPU."""
    from fairseq.data import data_utils

    encoder.eval()
    d = text_encoder.dictionary
    device = next(encoder.parameters()).device
    max_pos = encoder.max_positions()
    out = []
    for start in range(0, len(sentences), batch_size):
        ids = []
        for k in range(start, min(start + batch_size, len(sentences))):
            t = text_encoder.encode(sentences[k])
            if max_pos is not None and t.numel() > max_pos:
                raise ProbeError(f"{where[k]}: {t.numel()} tokens (with </s>); the encoder "
                                 f"accepts at most {max_pos}")
            ids.append(t)
        tokens = data_utils.collate_tokens(ids, d.pad(), d.eos(), left_pad=left_pad).to(device)
        lengths = torch.tensor([t.numel() for t in ids], device=device)
        enc = encoder(tokens, src_lengths=lengths)
        x = enc["encoder_out"][0].transpose(0, 1)  # B x T x C
        if x.shape[:2] != tokens.shape:
            raise ProbeError(f"encoder output {tuple(x.shape)} does not align with its input "
                             f"{tuple(tokens.shape)}")
        mask = tokens.ne(d.pad()).unsqueeze(-1).type_as(x)
        out.append(((x * mask).sum(1) / mask.sum(1)).float().cpu())
    return torch.cat(out, 0)


# --------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------

def probe_task(task_data: ProbingTask, encoder, text_encoder, settings: ProbeSettings,
               left_pad: bool = True) -> Dict:
    tokens0, unk0 = text_encoder.tokens, text_encoder.unknown
    feats, labels = {}, {}
    classes = sorted(set(task_data.labels("tr")))
    index = {lab: i for i, lab in enumerate(classes)}
    for s in SPLITS:
        ex = task_data.examples[s]
        feats[s] = sentence_features(encoder, text_encoder, [e[1] for e in ex],
                                     [f"{task_data.path}:{e[2]}" for e in ex], left_pad)
        labels[s] = torch.tensor([index[e[0]] for e in ex])
    n_tok = text_encoder.tokens - tokens0
    unk = (text_encoder.unknown - unk0) / n_tok if n_tok else None
    trained = train_probe(feats, labels, len(classes), settings)
    maj_label, maj_acc = majority_baseline(task_data.labels("tr"), task_data.labels("te"))
    return {"task": task_data.name, "file": task_data.path, "n": task_data.sizes(),
            "classes": len(classes), "accuracy": trained["accuracy"],
            "valid_accuracy": trained["valid_accuracy"], "best_epoch": trained["best_epoch"],
            "epochs": trained["epochs"], "valid_history": trained["valid_history"],
            "majority_label": maj_label,
            "majority_accuracy": maj_acc, "unknown_rate": unk, "feature_dim": feats["tr"].shape[1]}


def probe_checkpoint(args) -> Dict:
    from ctx_fairseq.eval.text_units import TextEncoder

    settings = ProbeSettings(args.hidden, args.dropout, args.l2, args.lr, args.batch_size,
                             args.max_epochs, args.patience, args.seed)
    settings.check()
    task_files = collect_task_files(args.task_file)
    tasks = [read_probing_file(p) for p in task_files]  # all errors before loading the model
    model, task, cfg = load_probe_model(args.path, args.data, cpu=not args.cuda,
                                        random_init=args.random_init, seed=args.seed)
    try:
        src_enc, _ = TextEncoder.pair_from_args(args, task, cfg)
    except ValueError as e:
        raise ProbeError(str(e))
    spec = task_options(task)
    left_pad = True if spec is None else spec.left_pad_source
    results = []
    for t in tasks:
        res = probe_task(t, model.encoder, src_enc, settings, left_pad)
        results.append(res)
        print(f"{res['task']}: accuracy {100 * res['accuracy']:.2f} (majority "
              f"{100 * res['majority_accuracy']:.2f}), best va epoch {res['best_epoch']}/"
              f"{res['epochs']}", file=sys.stderr)
    return {"checkpoint": args.path, "random_init": bool(args.random_init),
            "encoder": type(model.encoder).__name__,
            "arch": getattr(getattr(cfg, "model", None), "arch", None),
            "features": "mean of the last encoder layer over non-pad positions (</s> included)",
            "settings": settings.__dict__, "unknown_rate": src_enc.unknown_rate(),
            "tasks": results}


def format_table(result: Dict) -> str:
    head = ["task", "classes", "n (tr/va/te)", "majority", "accuracy", "va accuracy",
            "best epoch", "<unk>"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["tasks"]:
        n = r["n"]
        unk = "-" if r["unknown_rate"] is None else f"{100 * r['unknown_rate']:.1f}%"
        lines.append("| " + " | ".join([
            r["task"], str(r["classes"]), f"{n['tr']}/{n['va']}/{n['te']}",
            f"{100 * r['majority_accuracy']:.2f}", f"{100 * r['accuracy']:.2f}",
            f"{100 * r['valid_accuracy']:.2f}", f"{r['best_epoch']}/{r['epochs']}", unk]) + " |")
    return "\n".join(lines)


def plot(result: Dict, png: str) -> None:
    plt = pyplot()
    tasks = result["tasks"]
    xs = range(len(tasks))
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(tasks) + 2), 4))
    ax.bar([x - 0.2 for x in xs], [100 * r["accuracy"] for r in tasks], 0.4, label="probe")
    ax.bar([x + 0.2 for x in xs], [100 * r["majority_accuracy"] for r in tasks], 0.4,
           label="majority class")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['task']}\n(n={r['n']['te']})" for r in tasks])
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    title = os.path.basename(result["checkpoint"]) + (" (random init)" if result["random_init"]
                                                      else "")
    ax.set_title(f"probing: {title}")
    ax.legend()
    save_figure(fig, png)


def write_outputs(result: Dict, out_dir: str, prefix: str = "probe") -> Dict[str, str]:
    markdown = (f"# Probing {result['checkpoint']}"
                + (" (randomly initialised)" if result["random_init"] else "") + "\n\n"
                + format_table(result) + "\n")
    return write_table_files(out_dir, prefix, markdown, result, lambda png: plot(result, png))


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def _sizes(spec: str) -> Tuple[int, int, int]:
    try:
        vals = tuple(int(v) for v in spec.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected three positive integers TR,VA,TE")
    return vals


def _tasks(spec: str) -> List[str]:
    keys = [k.strip().lower() for k in spec.split(",") if k.strip()]
    bad = [k for k in keys if k not in GENERATORS]
    if not keys or bad:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected a comma-separated subset of "
                                         f"{','.join(GENERATORS)}")
    return list(dict.fromkeys(keys))


def get_parser() -> argparse.ArgumentParser:
    from ctx_fairseq.eval.text_units import add_text_unit_args

    p = argparse.ArgumentParser(
        prog="ctx-probe",
        description="Probing tasks (Conneau et al. 2018) on a frozen NMT encoder: generate "
                    "SentLen/WC/BShift from monolingual text, or train the probing classifier "
                    "on SentEval-format files.")
    sub = p.add_subparsers(dest="command", metavar="{generate,run}")
    sub.required = True

    g = sub.add_parser("generate", help="write SentLen, WC and BShift files from a text",
                       description="Write SentEval-format probing files (tr/va/te) from "
                                   "tokenized monolingual text.")
    g.add_argument("--text", action="append", required=True, metavar="FILE",
                   help="tokenized monolingual text, one sentence a line (repeatable)")
    g.add_argument("--out-dir", required=True, help="where to write the probing files")
    g.add_argument("--tasks", type=_tasks, default=list(GENERATORS),
                   help="comma-separated subset of sentlen,wc,bshift (default: all)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--min-words", type=int, default=5,
                   help="shortest sentence kept, in words (default 5, Conneau et al.)")
    g.add_argument("--max-words", type=int, default=28,
                   help="longest sentence kept, in words (default 28, Conneau et al.)")
    g.add_argument("--sizes", type=_sizes, default=(100000, 10000, 10000), metavar="TR,VA,TE",
                   help="largest tr,va,te sizes; smaller data is split in these proportions "
                        "(default 100000,10000,10000)")
    g.add_argument("--min-per-class", type=int, default=50,
                   help="classes with fewer distinct sentences are left out (default 50)")
    g.add_argument("--sentlen-bins", type=int, default=6, help="SentLen length bins (default 6)")
    g.add_argument("--wc-words", type=int, default=1000, help="WC target words (default 1000)")
    g.add_argument("--wc-rank-start", type=int, default=2000,
                   help="frequency rank (0-based) of the first WC word (default 2000)")

    r = sub.add_parser("run", help="probe a checkpoint's frozen encoder",
                       description="Train the probing classifier on a checkpoint's frozen, "
                                   "mean-pooled last encoder layer; report test accuracy and "
                                   "the majority-class baseline per task.")
    r.add_argument("--path", required=True, help="checkpoint (sentence-level)")
    r.add_argument("--data", required=True, help="binarized data directory (dictionaries)")
    r.add_argument("--task-file", action="append", required=True, metavar="FILE|DIR",
                   help="SentEval probing file, or a directory of *.txt files (repeatable)")
    r.add_argument("--out-dir", default=".", help="where to write probe.{md,json,png}")
    r.add_argument("--prefix", default="probe", help="output file name prefix")
    r.add_argument("--seed", type=int, default=1,
                   help="classifier initialisation and batch order (and --random-init)")
    r.add_argument("--hidden", type=int, default=50,
                   help="hidden units of the MLP; 0: logistic regression (default 50)")
    r.add_argument("--dropout", type=float, default=0.0, help="MLP dropout (default 0)")
    r.add_argument("--l2", type=float, default=1e-4,
                   help="L2 (weight decay) on the hidden layer (default 1e-4)")
    r.add_argument("--lr", type=float, default=2.5e-4, help="RMSprop learning rate (2.5e-4)")
    r.add_argument("--batch-size", type=int, default=64, help="mini-batch size (default 64)")
    r.add_argument("--max-epochs", type=int, default=100, help="(default 100)")
    r.add_argument("--patience", type=int, default=20,
                   help="stop after this many epochs without a better va accuracy (default 20)")
    r.add_argument("--random-init", action="store_true",
                   help="probe a randomly initialised (untrained) model of the checkpoint's "
                        "shape instead (the control)")
    r.add_argument("--cuda", action="store_true", help="run the encoder on the GPU")
    add_text_unit_args(r)
    return p


def _generate(args) -> Dict:
    text = read_text(args.text, args.min_words, args.max_words)
    generated = generate_tasks(text, args.tasks, args.seed, args.sizes, args.min_per_class,
                               args.sentlen_bins, args.wc_words, args.wc_rank_start)
    manifest = {
        "text": list(args.text), "seed": args.seed, "min_words": args.min_words,
        "max_words": args.max_words, "sizes": list(args.sizes),
        "min_per_class": args.min_per_class, "sentences": len(text.lines),
        "distinct_sentences": len(text.distinct),
        "tasks": {g.key: {"file": g.filename, **g.info} for g in generated.values()},
    }
    if "sentlen" in generated:
        manifest["sentlen_bins"] = args.sentlen_bins
    if "wc" in generated:
        manifest["wc_words"], manifest["wc_rank_start"] = args.wc_words, args.wc_rank_start
    paths = write_generated(args.out_dir, generated, manifest)
    for g in generated.values():
        n = g.info["sizes"]
        print(f"{g.key}: {len(g.info['classes'])} classes x {g.info['per_class']} sentences "
              f"(tr/va/te {n['tr']}/{n['va']}/{n['te']}) -> {g.filename}")
        for note in g.info["notes"]:
            print(f"  note: {note}")
    print_written(paths)
    return {"manifest": manifest, "paths": paths}


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """The command line; returns what it computed (``generate``: the manifest
    and paths; ``run``: the result and output paths)."""
    parser = get_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        result = probe_checkpoint(args)
    except ProbeError as e:
        raise SystemExit(f"ctx-probe {args.command}: error: {e}")
    paths = write_outputs(result, args.out_dir, args.prefix)
    print(format_table(result))
    if result["unknown_rate"] is not None:
        print(f"<unk> rate over all probing sentences: {100 * result['unknown_rate']:.2f}%")
    print_written(paths.values())
    return {"result": result, "paths": paths}


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script ``ctx-probe``: returns None (a console script hands its
    return value to ``sys.exit``)."""
    main(argv)


if __name__ == "__main__":
    cli_main(sys.argv[1:])
