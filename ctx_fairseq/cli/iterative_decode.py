"""ctx-iterative-decode: two-pass (or more) iterative decoding of documents
(Maruf and Haffari 2018; Maruf et al. 2019, Sec. 2.2) with fairseq-generate.

Models with target-side document context (``transformer_selective_doc`` with
``--context-integration decoder``) translate a sentence given the
translations of the other sentences of its document. Pass 1 translates every
sentence without that context: by a sentence-level checkpoint
(``--first-pass-path``, e.g. the stage-1 ``transformer``: the paper's
initialisation, recommended) or, without it, by the same checkpoint with
empty target context (every target memory sentence
empty, so each sentence is translated by the model's sentence-level part).
Each later pass translates every sentence again with the previous pass's
hypotheses as target context (``--target-context-file``), the other
sentences' translations fixed.

    ctx-iterative-decode DATA-BIN --path ckpt/checkpoint_best.pt --out-dir decode \\
        [--first-pass-path stage1/checkpoint_best.pt] [--passes 2] [--gen-subset test] \\
        [--beam 4] [--max-tokens 8000] -- --task document_translation \\
        --document-context online --document-memory --target-context-size 1

Arguments after ``--`` go to every fairseq-generate pass (the first pass by
``--first-pass-path`` gets them without the document-task options). ``--post-process``/``--remove-bpe``
there apply to the last pass only: the hypotheses handed from pass to pass
stay in the data's units (BPE). Writes ``OUT/generate-pass{k}.txt`` (what
fairseq-generate printed) and ``OUT/hyp-pass{k}.txt`` (hypotheses, one per
line in corpus order); prints the last pass's output and, on stderr, the BLEU
of each pass (sacreBLEU against the references in the binarized data).
"""

import argparse
import contextlib
import io
import os
import sys
from typing import Dict, List, Optional, Sequence

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_POST_PROCESS = ("--post-process", "--remove-bpe")
def _document_task_options() -> Dict[str, bool]:
    """The document task's own options (flag -> takes a value), from its
    configuration (those of fairseq's ``translation`` task excluded): a
    sentence-level first pass gets the rest."""
    import dataclasses

    from fairseq.tasks.translation import TranslationConfig

    from ctx_fairseq.tasks.document_config import DocumentTranslationConfig

    base = {f.name for f in dataclasses.fields(TranslationConfig)}
    out = {"--task": True}
    for f in dataclasses.fields(DocumentTranslationConfig):
        if f.name not in base and f.metadata.get("help"):  # (interpolated fields have none)
            out["--" + f.name.replace("_", "-")] = f.type is not bool
    return out


def sentence_level_args(args: Sequence[str]) -> List[str]:
    """``args`` without the document-task options (for a sentence-level
    first-pass checkpoint, translated with fairseq's own task)."""
    options = _document_task_options()
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in options:
            skip = options[name] and "=" not in a
            continue
        out.append(a)
    return out


def _strip_post_process(args: Sequence[str]) -> List[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _POST_PROCESS:
            # --remove-bpe takes an optional value; --post-process too
            if "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("-"):
                skip = True
            continue
        out.append(a)
    return out


def run_generate(argv: Sequence[str]) -> str:
    """fairseq-generate in-process; returns what it printed."""
    import ctx_fairseq  # noqa: F401
    from fairseq import options
    from fairseq_cli import generate as fs_generate

    args = options.parse_args_and_arch(options.get_generation_parser(), list(argv))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fs_generate.main(args)
    return out.getvalue()


def hypotheses_by_id(text: str, expected: int, what: str) -> List[str]:
    hyps: Dict[int, str] = {}
    for line in text.splitlines():
        if line.startswith("H-"):
            head, _score, hyp = (line.split("\t") + ["", ""])[:3]
            hyps.setdefault(int(head[2:]), hyp)  # --nbest: keep the best (first)
    missing = [i for i in range(expected) if i not in hyps]
    if missing:
        raise RuntimeError(f"{what}: no hypothesis for {len(missing)} of {expected} sentences "
                           f"(first: {missing[:5]}); every sentence must be translated before "
                           "the next pass can use the translations as context")
    return [hyps[i] for i in range(expected)]


def count_sentences(data: str, split: str) -> int:
    path = os.path.join(data.split(os.pathsep)[0], f"{split}.docids")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found; iterative decoding needs the document ids "
                                "of the split (--task document_translation)")
    with open(path, encoding="utf-8-sig") as f:
        return sum(1 for _ in f)


def iterative_decode(data: str, path: str, out_dir: str, passes: int = 2,
                     first_pass_path: Optional[str] = None, gen_subset: str = "test",
                     beam: int = 4, max_tokens: int = 8000,
                     generate_args: Sequence[str] = (), log=None) -> Dict:
    from ctx_fairseq.generate_output import corpus_bleu, read_generate_output

    if passes < 2:
        raise ValueError("--passes must be at least 2 (pass 1 has no target context)")
    log = log or (lambda msg: print(msg, file=sys.stderr))
    os.makedirs(out_dir, exist_ok=True)
    n = count_sentences(data, gen_subset)
    common = ["--user-dir", USER_DIR, "--gen-subset", gen_subset, "--beam", str(beam),
              "--max-tokens", str(max_tokens), "--num-workers", "0"]
    inner = _strip_post_process(generate_args)
    result = {"passes": []}
    hyp_file = None
    for k in range(1, passes + 1):
        last = k == passes
        extra = list(generate_args if last else inner)
        if k == 1 and first_pass_path:
            # a sentence-level model: the same search options, without the document task
            argv = [data, "--path", first_pass_path, *common, *sentence_level_args(extra)]
        else:
            if k == 1:  # the same model without target context: empty translations
                hyp_file = os.path.join(out_dir, "hyp-pass0-empty.txt")
                with open(hyp_file, "w", encoding="utf-8") as f:
                    f.write("\n" * n)
            argv = [data, "--path", path, *common, *extra, "--target-context-file", hyp_file]
        text = run_generate(argv)
        gen_path = os.path.join(out_dir, f"generate-pass{k}.txt")
        with open(gen_path, "w", encoding="utf-8") as f:
            f.write(text)
        hyps = hypotheses_by_id(text, n, f"pass {k}")
        hyp_file = os.path.join(out_dir, f"hyp-pass{k}.txt")
        with open(hyp_file, "w", encoding="utf-8") as f:
            f.write("".join(h + "\n" for h in hyps))
        g = read_generate_output(gen_path)
        bleu = corpus_bleu(g.hypotheses, g.references)
        result["passes"].append({"pass": k, "bleu": bleu, "generate_output": gen_path,
                                 "hypotheses": hyp_file})
        log(f"ctx-iterative-decode: pass {k}: BLEU {bleu:.2f} ({gen_path})")
        result["output"] = text
    return result


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-iterative-decode", description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="binarized data directory (with {split}.docids)")
    p.add_argument("--path", required=True, help="the document-level checkpoint")
    p.add_argument("--out-dir", required=True, help="where each pass's output goes")
    p.add_argument("--first-pass-path", default=None,
                   help="sentence-level checkpoint for pass 1 (default: the same checkpoint "
                        "with empty target context)")
    p.add_argument("--passes", type=int, default=2, help="(default: 2)")
    p.add_argument("--gen-subset", default="test", help="(default: test)")
    p.add_argument("--beam", type=int, default=4, help="(default: 4)")
    p.add_argument("--max-tokens", type=int, default=8000, help="(default: 8000)")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    p = get_parser()
    a = p.parse_args(argv)
    try:
        result = iterative_decode(a.data, a.path, a.out_dir, a.passes, a.first_pass_path,
                                  a.gen_subset, a.beam, a.max_tokens, extra)
    except (OSError, ValueError, RuntimeError) as err:
        p.error(str(err))
    sys.stdout.write(result["output"])
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
