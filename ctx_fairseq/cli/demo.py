"""ctx-demo: the main job end to end on the embedded toy corpus.

Steps: make the toy corpus (``ctx-make-toy``), binarize it with
``fairseq-preprocess --joined-dictionary``, then for each architecture train a
small model with ``fairseq-train --user-dir ctx_fairseq``, translate the test
set with ``fairseq-generate``, score BLEU with sacreBLEU and the contrastive
test set by antecedent distance, measure each context model's CXMI against
shuffled context on the test split (:func:`ctx_fairseq.eval.context_use.cxmi.compute_cxmi`:
the true and the shuffled context's teacher-forced passes; "-" for
sentence-level models, and "-" with a footnote for a model ``ctx-cxmi``
refuses, e.g. one with a document memory), and print one side-by-side table.

Every step writes into ``--workdir`` and records the exact command it ran; a
re-run with the same settings reuses finished steps, a changed setting re-runs
the steps it affects. A failed step stops the demo with the command and the
path of its log.

What the demo knows of each architecture (its task options, a stage-1
model, two-pass decoding, the architectures it adds to the default
``--archs``) is in :mod:`ctx_fairseq.cli.arch_hooks` (``DemoHooks``; a
plugin registers its own with ``register_demo_hooks``); sentence-level models
need none. Every checkpoint is scored by the one contrastive scorer
(``ctx_fairseq.eval.scoring.contrastive.evaluate_checkpoint``, the task's context).
"""

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small model shape shared by every architecture in the demo.
DEMO_MODEL_ARGS = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.1",
]


#: what a score step's results hold; a change re-runs the score steps of an
#: earlier run (whose results lack the newer numbers) instead of reusing them
SCORE_VERSION = "score: BLEU, contrastive, CXMI vs shuffled"


class StepFailed(RuntimeError):
    pass


class Demo:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.workdir)
        self.logs = os.path.join(self.work, "logs")
        self.step_no = 0
        self.total_steps = 2 + 3 * len(args.archs)
        self.t0 = time.time()
        self._trained: Dict[str, tuple] = {}

    # ------------------------------------------------------------------ steps
    def say(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.0f}s] {msg}", flush=True)

    def _marker(self, name: str) -> str:
        return os.path.join(self.work, "steps", name + ".done")

    def _is_done(self, name: str, key: str, outputs: List[str]) -> bool:
        marker = self._marker(name)
        if not os.path.exists(marker) or not all(os.path.exists(o) for o in outputs):
            return False
        with open(marker, encoding="utf-8") as f:
            return f.read() == key

    def _mark_done(self, name: str, key: str) -> None:
        os.makedirs(os.path.dirname(self._marker(name)), exist_ok=True)
        with open(self._marker(name), "w", encoding="utf-8") as f:
            f.write(key)

    def run_step(self, name: str, title: str, cmd: List[str], outputs: List[str],
                 stdout_path: Optional[str] = None, progress_total: Optional[int] = None,
                 depends: Sequence[str] = (), fresh_dir: Optional[str] = None) -> str:
        """Run ``cmd`` unless an identical earlier run (same command, same inputs
        from the steps it ``depends`` on) finished; log to logs/NAME.log.
        Returns the step's key, which later steps name in ``depends``.
        ``fresh_dir`` is emptied before a (re-)run: a training step whose
        settings changed starts anew instead of resuming an older checkpoint."""
        self.step_no += 1
        key = hashlib.sha256(json.dumps([cmd, list(depends)]).encode()).hexdigest()
        prefix = f"[{self.step_no}/{self.total_steps}] {title}"
        if self._is_done(name, key, outputs):
            self.say(f"{prefix}: done earlier, reused")
            return key
        if fresh_dir:
            import shutil

            shutil.rmtree(fresh_dir, ignore_errors=True)
        os.makedirs(self.logs, exist_ok=True)
        log_path = os.path.join(self.logs, name + ".log")
        self.say(f"{prefix} ...")
        start = time.time()
        with open(log_path, "w", encoding="utf-8") as log:
            log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            log.flush()
            out = open(stdout_path + ".partial", "w", encoding="utf-8") if stdout_path else log
            try:
                proc = subprocess.Popen(cmd, stdout=out, stderr=log, cwd=self.work,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
                last = time.time()
                while proc.poll() is None:
                    time.sleep(1.0)
                    if progress_total and time.time() - last > 20:
                        last = time.time()
                        done = _last_num_updates(log_path)
                        self.say(f"    update {done}/{progress_total}")
            finally:
                if stdout_path:
                    out.close()
        if proc.returncode != 0:
            raise StepFailed(
                f"step '{title}' failed with exit code {proc.returncode}\n"
                f"  command: {' '.join(shlex.quote(c) for c in cmd)}\n  log: {log_path}"
            )
        if stdout_path:
            os.replace(stdout_path + ".partial", stdout_path)
        self._mark_done(name, key)
        self.say(f"{prefix}: done in {time.time() - start:.0f}s")
        return key

    # ------------------------------------------------------------------- main
    def run(self) -> Dict[str, Dict]:
        a = self.args
        py = sys.executable
        raw = os.path.join(self.work, "data")
        binned = os.path.join(self.work, "data-bin")
        toy_key = self.run_step(
            "make-toy", "make the toy corpus",
            [py, "-m", "ctx_fairseq.cli.make_toy", "--out", raw, "--docs", str(a.docs),
             "--sents-per-doc", str(a.sents_per_doc), "--max-distance", str(a.max_distance),
             "--seed", str(a.seed)],
            [os.path.join(raw, "toy.json")],
        )
        data_key = self.run_step(
            "preprocess", "fairseq-preprocess (joined dictionary)",
            [py, "-m", "ctx_fairseq.cli.demo", "--_preprocess", raw, binned],
            [os.path.join(binned, "dict.src.txt"), os.path.join(binned, "test.docids")],
            depends=[toy_key],
        )
        results = {}
        for arch in a.archs:
            results[arch] = self.run_arch(arch, binned, raw, data_key)
        return results

    def train(self, arch: str, binned: str, data_key: str):
        """Train ``arch`` (once per run; its ``DemoHooks.stage1`` names
        the sentence-level architecture it is initialised from, trained
        first: the papers' two-stage training). Returns (checkpoint, step key)."""
        if arch in self._trained:
            return self._trained[arch]
        a = self.args
        py = sys.executable
        from ctx_fairseq.cli.arch_hooks import demo_hooks

        hooks = demo_hooks(arch)
        depends, init = [data_key], []
        stage1 = hooks.stage1
        if stage1:
            s1_ckpt, s1_key = self.train(stage1, binned, data_key)
            depends.append(s1_key)
            init = ["--init-from-sentence-checkpoint", s1_ckpt]
        ckpt_dir = os.path.join(self.work, "checkpoints", arch)
        ckpt = os.path.join(ckpt_dir, "checkpoint_last.pt")
        train_cmd = [
            py, "-m", "fairseq_cli.train", binned, "--user-dir", USER_DIR, "--arch", arch,
            *DEMO_MODEL_ARGS, *hooks.train_args_for(arch), *init,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", "4096", "--max-update", str(a.max_update), "--seed", str(a.seed),
            "--save-dir", ckpt_dir, "--no-epoch-checkpoints", "--disable-validation",
            "--no-progress-bar", "--log-interval", "25", "--num-workers", "0",
            # no prefetch thread: with one, fairseq-train sometimes aborts at exit
            # ("terminate called without an active exception")
            "--data-buffer-size", "0",
        ]
        key = self.run_step(f"train-{arch}", f"train {arch}" + (f" (from {stage1})" if stage1
                                                                  else ""),
                            train_cmd, [ckpt], progress_total=a.max_update, depends=depends,
                            fresh_dir=ckpt_dir)
        self._trained[arch] = (ckpt, key)
        return ckpt, key

    def run_arch(self, arch: str, binned: str, raw: str, data_key: str) -> Dict:
        from ctx_fairseq.cli.arch_hooks import demo_hooks

        py = sys.executable
        hooks = demo_hooks(arch)
        ckpt, train_key = self.train(arch, binned, data_key)
        gen = os.path.join(self.work, "generate", f"{arch}.txt")
        os.makedirs(os.path.dirname(gen), exist_ok=True)
        gen_cmd = [
            py, "-m", "fairseq_cli.generate", binned, "--user-dir", USER_DIR, "--path", ckpt,
            "--gen-subset", "test", "--beam", "4", "--max-tokens", "8000", "--num-workers", "0",
            *hooks.generate_args_for(arch),
        ]
        depends = [train_key]
        if hooks.two_pass:  # the first pass by the stage-1 model
            stage1 = hooks.stage1
            first_pass = self._trained[stage1][0] if stage1 in self._trained else None
            if first_pass:
                depends.append(self._trained[stage1][1])
            gen_cmd = hooks.generate_command(arch, py, binned, ckpt,
                                             os.path.join(self.work, "generate", arch),
                                             first_pass=first_pass) or gen_cmd
        gen_key = self.run_step(f"generate-{arch}", f"fairseq-generate {arch}", gen_cmd, [gen],
                                stdout_path=gen, depends=depends)
        res_path = os.path.join(self.work, "results", f"{arch}.json")
        self.run_step(
            f"score-{arch}", f"BLEU + contrastive accuracy + CXMI {arch}",
            [py, "-m", "ctx_fairseq.cli.demo", "--_score", arch, ckpt, binned,
             os.path.join(raw, "test.contrastive.jsonl"), gen, res_path],
            [res_path], depends=[train_key, gen_key, SCORE_VERSION],
        )
        with open(res_path, encoding="utf-8") as f:
            return json.load(f)


def _last_num_updates(log_path: str) -> int:
    last = 0
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "num_updates" in line:
                    for part in line.split("|"):
                        part = part.strip()
                        if part.startswith("num_updates"):
                            last = int(part.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return last


def _preprocess(raw: str, binned: str) -> None:
    """fairseq-preprocess with a joined dictionary, then the docids beside the binaries."""
    import shutil

    from fairseq import options
    from fairseq_cli import preprocess

    tmp = binned + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", os.path.join(raw, "train"), "--validpref", os.path.join(raw, "valid"),
        "--testpref", os.path.join(raw, "test"), "--destdir", tmp, "--joined-dictionary",
        "--workers", "2",
    ])
    preprocess.main(args)
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(raw, f"{split}.docids"), tmp)
    shutil.rmtree(binned, ignore_errors=True)
    os.replace(tmp, binned)


def _score(arch: str, ckpt: str, binned: str, jsonl: str, gen: str, out: str) -> None:
    from ctx_fairseq.eval.scoring import contrastive
    from ctx_fairseq.eval.scoring.suite_report import SuiteOptions
    from ctx_fairseq.generate_output import corpus_bleu, read_generate_output

    g = read_generate_output(gen)
    result = {"arch": arch, "bleu": corpus_bleu(g.hypotheses, g.references),
              "sentences": len(g.ids)}
    # the one scorer for every architecture: context exactly as the task builds it
    result["contrastive"] = contrastive.evaluate_checkpoint(
        ckpt, binned, jsonl, SuiteOptions(fmt="toy", gold_target_context=True))
    model, _task, _cfg = contrastive.load_checkpoint(ckpt, binned)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["cxmi"] = _cxmi(ckpt, binned, sentence_level=not contrastive.uses_context(_task))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".partial", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".partial", out)


def _cxmi(ckpt: str, binned: str, sentence_level: bool) -> Dict:
    """CXMI against shuffled context on the test split (nats per target
    token), through :func:`ctx_fairseq.eval.context_use.cxmi.compute_cxmi`; for a
    sentence-level model or one that ``ctx-cxmi`` refuses, ``shuffled`` is
    None and ``why`` says why (any other error fails the step)."""
    from ctx_fairseq.eval.context_use import cxmi

    if sentence_level:
        return {"shuffled": None, "why": "sentence-level model (no context)", "refused": False}
    try:
        model, task, cfg = cxmi.load(ckpt, binned, cuda=False)
        # refused too: a test split of one document (no other document's context)
        result, _words = cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"])
    except cxmi.CXMIError as err:
        return {"shuffled": None, "why": str(err).replace(ckpt, "the checkpoint"),
                "refused": True}
    # nats per target token (ctx-cxmi's cxmi_per_token; its headline cxmi is the paper's
    # mean of per-sentence means against the empty context)
    return {"shuffled": result["shuffled"]["cxmi_per_token"], "tokens": result["tokens"],
            "sentences": result["sentences"], "refused": False,
            "sentences_with_context": result["sentences_with_context"]}


def format_table(results: Dict[str, Dict], max_distance: int) -> str:
    dists = [str(d) for d in range(1, max_distance + 1)]
    head = (["arch", "params", "BLEU", "CXMI", "pronoun"] + [f"pron d={d}" for d in dists]
            + ["cohesion"] + [f"coh d={d}" for d in dists])
    rows = []
    notes: Dict[str, List[str]] = {}  # why ctx-cxmi refused -> the architectures

    def cxmi_cell(arch, x):
        if x["shuffled"] is not None:
            return f"{x['shuffled']:.4f}"
        if not x["refused"]:
            return "-"
        notes.setdefault(x["why"], []).append(arch)
        return f"-[{list(notes).index(x['why']) + 1}]"

    def pct(x):
        return "-" if x is None or x.get("accuracy") is None else f"{100 * x['accuracy']:.1f}"

    for arch, r in results.items():
        c = r["contrastive"]
        row = [arch, f"{r['params'] / 1e6:.2f}M", f"{r['bleu']:.2f}",
               cxmi_cell(arch, r["cxmi"])]
        for ph in ("pronoun", "lexical_cohesion"):
            row.append(pct(c["by_phenomenon"].get(ph)))
            row += [pct(c["by_distance"].get(ph, {}).get(d)) for d in dists]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append("(contrastive accuracy in %, by antecedent distance d; chance: pronoun 33.3, "
                 "cohesion 50.0)")
    lines.append("(CXMI: nats per target token of the test split, log p with the true context "
                 "minus log p with shuffled context (ctx-cxmi); - for sentence-level models)")
    for k, (why, archs) in enumerate(notes.items(), 1):
        lines.append(f"[{k}] no CXMI for {', '.join(archs)}: ctx-cxmi refuses it: {why}")
    return "\n".join(lines)


def plot_results(results: Dict, max_distance: int, png: str) -> None:
    """Contrastive accuracy by antecedent distance, one bar per architecture,
    one panel per phenomenon (the table's figures)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    dists = [str(d) for d in range(1, max_distance + 1)]
    phenomena = [("pronoun", 100 / 3), ("lexical_cohesion", 50.0)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    width = 0.8 / max(1, len(results))
    x = np.arange(len(dists))
    for ax, (ph, chance) in zip(axes, phenomena):
        for k, (arch, r) in enumerate(results.items()):
            by_d = r["contrastive"]["by_distance"].get(ph, {})
            acc = [100 * (by_d.get(d) or {}).get("accuracy", 0) or 0 for d in dists]
            ax.bar(x + k * width, acc, width, label=arch)
        ax.axhline(chance, color="gray", linestyle="--", linewidth=1)
        ax.set_xticks(x + width * (len(results) - 1) / 2)
        ax.set_xticklabels([f"d={d}" for d in dists])
        ax.set_title(f"{ph} (dashed: chance)")
        ax.set_ylim(0, 100)
    axes[0].set_ylabel("contrastive accuracy (%)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def get_parser() -> argparse.ArgumentParser:
    from ctx_fairseq.cli.arch_hooks import default_demo_archs

    p = argparse.ArgumentParser(
        prog="ctx-demo",
        description="Train and compare architectures on the synthetic discourse corpus: "
        "BLEU, CXMI against shuffled context and contrastive accuracy by antecedent distance, "
        "side by side.",
    )
    p.add_argument("--workdir", default="ctx-demo-work",
                   help="where data, checkpoints, logs and results go (default: ./ctx-demo-work)")
    p.add_argument("--archs", default=",".join(default_demo_archs()),
                   help="comma-separated architectures (default: %(default)s)")
    p.add_argument("--max-update", type=int, default=300,
                   help="training updates per architecture (default: 300)")
    p.add_argument("--seed", type=int, default=1, help="seed for data and training (default: 1)")
    p.add_argument("--docs", type=int, default=1000, help="training documents (default: 1000)")
    p.add_argument("--sents-per-doc", type=int, default=10, help="(default: 10)")
    p.add_argument("--max-distance", type=int, default=3,
                   help="maximum antecedent distance K (default: 3)")
    p.add_argument("--_preprocess", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--_score", nargs=6, help=argparse.SUPPRESS)
    return p


def cli_main(argv=None) -> None:
    parser = get_parser()
    args = parser.parse_args(argv)
    if args._preprocess:
        _preprocess(*args._preprocess)
        return
    if args._score:
        _score(*args._score)
        return
    import ctx_fairseq  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY

    args.archs = [x.strip() for x in args.archs.split(",") if x.strip()]
    unknown = [x for x in args.archs if x not in ARCH_MODEL_REGISTRY]
    if not args.archs or unknown:
        parser.error(f"--archs: unknown architecture(s) {', '.join(unknown) or '(none given)'}; "
                     "see `fairseq-train --user-dir ctx_fairseq --help` for the list")
    if args.max_update < 1:
        parser.error("--max-update must be >= 1")
    demo = Demo(args)
    demo.say(f"ctx-demo: archs {', '.join(args.archs)}; workdir {demo.work}")
    try:
        results = demo.run()
    except StepFailed as err:
        print(f"ctx-demo: {err}", file=sys.stderr)
        sys.exit(1)
    table = format_table(results, args.max_distance)
    with open(os.path.join(demo.work, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(demo.work, "results.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    plot_results(results, args.max_distance, os.path.join(demo.work, "results.png"))
    demo.say(f"finished; results in {os.path.join(demo.work, 'results.txt')}\n")
    print(table)


if __name__ == "__main__":
    cli_main(sys.argv[1:])
