"""Run fairseq's command-line entry points in-process (as fairseq's own
tests/test_binaries.py does), so the test suite stays fast."""

import contextlib
import io
import os
import sys
from typing import List

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO_ROOT, "ctx_fairseq")

# Small model dimensions that every transformer-derived architecture accepts.
TINY_MODEL_ARGS = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def preprocess(argv: List[str]) -> None:
    from fairseq import options
    from fairseq_cli import preprocess as fs_preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(argv)
    fs_preprocess.main(args)


def train(argv: List[str]) -> None:
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train as fs_train

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["--user-dir", USER_DIR] + argv)
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, fs_train.main)


def generate(argv: List[str]) -> str:
    """Run fairseq-generate; returns what it printed."""
    from fairseq import options
    from fairseq_cli import generate as fs_generate

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, ["--user-dir", USER_DIR] + argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fs_generate.main(args)
    return out.getvalue()


def train_and_generate(data_dir: str, save_dir: str, arch: str, extra: List[str] = (),
                       max_update: int = 3, gen_extra: List[str] = ()) -> str:
    """Train ``arch`` for a few updates on ``data_dir`` and beam-search its test set."""
    train(
        [data_dir, "--arch", arch, *TINY_MODEL_ARGS, *extra,
         "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
         "--max-update", str(max_update), "--save-dir", save_dir,
         "--no-progress-bar", "--log-interval", "1", "--no-epoch-checkpoints",
         "--seed", "1", "--num-workers", "0", "--disable-validation"]
    )
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.exists(ckpt), ckpt
    return generate(
        [data_dir, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
         "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "20", *gen_extra]
    )


def hypotheses(generate_output: str) -> List[str]:
    return [line.split("\t")[2] for line in generate_output.splitlines() if line.startswith("H-")]


def interactive(argv: List[str]) -> str:
    """Run fairseq-interactive (``--input FILE`` in ``argv``); returns what it printed."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import interactive as fs_interactive

    parser = options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(parser, ["--user-dir", USER_DIR] + argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fs_interactive.main(convert_namespace_to_omegaconf(args))
    return out.getvalue()
