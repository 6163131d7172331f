"""Run fairseq's command-line entry points in-process (as fairseq's own
tests/test_binaries.py does), so the test suite stays fast; build tiny models
from the command line as fairseq does, and random token batches for them.

Device: fairseq's CLIs run on CUDA whenever a GPU is visible unless given
``--cpu``. ``train``, ``generate`` and ``interactive`` (and
``train_and_generate``) run on the CPU unless told otherwise, so the suite
computes the same numbers on a GPU machine as on a CPU-only one (tests compare
CLI output with numbers computed in-process on the CPU): ``--cpu`` is added
unless ``device="cuda"`` is given, or ``device`` is left out and the command
asks for reduced precision (``--fp16``, ``--bf16``, ``--amp``: a CUDA run,
as in tests/test_cuda.py).
"""

import contextlib
import io
import os
from typing import Callable, List, Optional, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO_ROOT, "ctx_fairseq")

# Small model dimensions that every transformer-derived architecture accepts.
TINY_MODEL_ARGS = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


class DictionaryTask:
    """What a model's ``build_model`` reads from a translation task: the
    (joined) source and target dictionary."""

    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def build_tiny_model(arch: str, extra: Sequence[str] = (), vocab: int = 40,
                     task: Callable = DictionaryTask, setup: Optional[Callable] = None,
                     double: bool = True):
    """``(model, dictionary)``: ``arch`` built as fairseq builds it from the
    command line (``TINY_MODEL_ARGS``: 2+2 layers, d=32; dropout off; then
    ``extra``) over a dictionary of ``vocab`` types (``task(dictionary)`` is
    what ``build_model`` gets), seeded (0), with non-trivial biases and
    LayerNorm parameters (every 1-dim parameter is moved); then ``setup(model)``
    if given, the cast to float64 (``double``) and eval mode."""
    import torch
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    from ctx_fairseq.models.transformer_dc import _dummy_dictionary

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", arch, "--task", "translation", "--dropout", "0",
         *TINY_MODEL_ARGS, *extra])
    d = _dummy_dictionary(vocab)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task(d))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    if setup is not None:
        setup(model)
    if double:
        model = model.double()
    return model.eval(), d


def random_tokens(d, lengths: Sequence[int], seed: int, left_pad: bool = True):
    """A padded batch (``len(lengths) x max(lengths)``) of random sentences of
    ``d``'s words, each ended by ``</s>`` (length 0: an all-padding row)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    width = max(max(lengths), 1)
    out = torch.full((len(lengths), width), d.pad(), dtype=torch.long)
    for r, n in enumerate(lengths):
        if n:
            s = torch.randint(d.nspecial, len(d), (n,), generator=g)
            s[-1] = d.eos()
            if left_pad:
                out[r, width - n:] = s
            else:
                out[r, :n] = s
    return out


def unpadded_row(t, r: int, pad: int):
    """Row ``r`` of a batch without its padding, as a batch of one (an
    all-padding row stays one padding column)."""
    x = t[r]
    return x[x.ne(pad)].unsqueeze(0) if x.ne(pad).any() else x[:1].clone().unsqueeze(0)


def decode_with_reorder(model, encoder_out, prev, split: int, order):
    """Decode ``prev`` (``N x T``) step by step with an incremental state and,
    after ``split`` steps, reorder the hypotheses by ``order`` (``N`` rows) as
    beam search does (``reorder_incremental_state_scripting``,
    ``reorder_encoder_out``; the tokens of the first ``split`` steps follow
    the reorder). Returns ``(steps, prev2, encoder_out2)``: the last position's
    output of every step (``N x T x V``), the tokens a full pass over the
    reordered hypotheses sees, and the reordered ``encoder_out``."""
    import torch

    state, steps = {}, []
    for t in range(split):
        o, _ = model.decoder(prev[:, :t + 1], encoder_out, incremental_state=state)
        steps.append(o[:, -1])
    model.decoder.reorder_incremental_state_scripting(state, order)
    encoder_out2 = model.encoder.reorder_encoder_out(encoder_out, order)
    prev2 = torch.cat([prev[order, :split], prev[:, split:]], 1)
    for t in range(split, prev.size(1)):
        o, _ = model.decoder(prev2[:, :t + 1], encoder_out2, incremental_state=state)
        steps.append(o[:, -1])
    return torch.stack(steps, 1), prev2, encoder_out2


def loaded_and_fresh(model, checkpoint_state):
    """``(loaded, fresh)``: the names in ``model``'s state dict that the
    (sentence-level) ``checkpoint_state`` has, each asserted equal to the
    checkpoint's tensor (cast to the model's dtype), and those it has not."""
    import torch

    own = model.state_dict()
    loaded = [k for k in own if k in checkpoint_state]
    for k in loaded:
        assert torch.equal(own[k], checkpoint_state[k].to(own[k].dtype)), k
    return loaded, [k for k in own if k not in checkpoint_state]


_GPU_FLAGS = ("--fp16", "--bf16", "--amp", "--memory-efficient-fp16", "--memory-efficient-bf16")


def with_device(argv: Sequence[str], device: Optional[str] = None) -> List[str]:
    """``argv`` with ``--cpu`` unless it is to run on CUDA (module docstring)."""
    argv = list(argv)
    if device is None:
        device = "cuda" if any(a in _GPU_FLAGS for a in argv) else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: expected 'cpu' or 'cuda'")
    if device == "cuda":
        if "--cpu" in argv:
            raise ValueError("device='cuda' with --cpu in the arguments")
        return argv
    return argv if "--cpu" in argv else argv + ["--cpu"]


def cli_args(parser, argv: Sequence[str], device: Optional[str] = None):
    """``argv`` parsed by fairseq's ``parser`` (``parse_args_and_arch``) as
    the plugin's commands run: ``--user-dir`` the plugin, on the device
    :func:`with_device` chooses."""
    from fairseq import options

    return options.parse_args_and_arch(parser, ["--user-dir", USER_DIR]
                                       + with_device(argv, device))


def printed(run: Callable[[], None]) -> str:
    """What ``run()`` printed (fairseq-generate and fairseq-interactive print
    their translations)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run()
    return out.getvalue()


def preprocess(argv: List[str]) -> None:
    from fairseq import options
    from fairseq_cli import preprocess as fs_preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(argv)
    fs_preprocess.main(args)


def train(argv: List[str], device: Optional[str] = None) -> None:
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train as fs_train

    cfg = convert_namespace_to_omegaconf(cli_args(options.get_training_parser(), argv, device))
    distributed_utils.call_main(cfg, fs_train.main)


def generate(argv: List[str], device: Optional[str] = None) -> str:
    """Run fairseq-generate; returns what it printed."""
    from fairseq import options
    from fairseq_cli import generate as fs_generate

    args = cli_args(options.get_generation_parser(), argv, device)
    return printed(lambda: fs_generate.main(args))


def train_and_generate(data_dir: str, save_dir: str, arch: str, extra: List[str] = (),
                       max_update: int = 3, gen_extra: List[str] = (),
                       device: Optional[str] = None) -> str:
    """Train ``arch`` for a few updates on ``data_dir`` and beam-search its test set."""
    train(
        [data_dir, "--arch", arch, *TINY_MODEL_ARGS, *extra,
         "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
         "--max-update", str(max_update), "--save-dir", save_dir,
         "--no-progress-bar", "--log-interval", "1", "--no-epoch-checkpoints",
         "--seed", "1", "--num-workers", "0", "--disable-validation"], device
    )
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.exists(ckpt), ckpt
    return generate(
        [data_dir, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
         "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "20", *gen_extra], device
    )


def hypotheses(generate_output: str) -> List[str]:
    return [line.split("\t")[2] for line in generate_output.splitlines() if line.startswith("H-")]


def training_task_and_cfg(argv: Sequence[str]):
    """``(task, cfg)`` of the fairseq-train command line ``argv``, parsed and
    the task set up as fairseq-train does; nothing is built or trained."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), list(argv))
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task), cfg


def states_from_sentence_checkpoint(task, cfg, checkpoint: str, caplog):
    """``(ours, init, theirs)``, state dicts for ``--init-from-sentence-
    checkpoint``: of the model ``task`` builds from ``cfg`` (seed 3; its INFO
    log captured by ``caplog``), of the same model's initialisation alone
    (seed 3, ``from_checkpoint=True``: the checkpoint is not read) and the
    model state of ``checkpoint``."""
    import logging

    import torch
    from fairseq import checkpoint_utils

    torch.manual_seed(3)
    with caplog.at_level(logging.INFO):
        model = task.build_model(cfg.model)
    torch.manual_seed(3)
    plain = task.build_model(cfg.model, from_checkpoint=True)  # the initialisation alone
    theirs = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)["model"]
    return model.state_dict(), plain.state_dict(), theirs


def train_from_sentence_checkpoint(argv: Sequence[str], checkpoint: str, save_dir: str):
    """fairseq-train ``argv`` (data directory, architecture, task and model
    options) initialised from ``checkpoint`` (``--init-from-sentence-
    checkpoint``) for 3 updates (adam, lr 1e-3, seed 1, no validation) into
    ``save_dir``: ``(state, theirs)``, the state of its last checkpoint,
    asserted 3 updates in, and the model state of ``checkpoint``."""
    from fairseq import checkpoint_utils

    train([*argv, "--init-from-sentence-checkpoint", checkpoint, "--optimizer", "adam",
           "--lr", "1e-3", "--max-tokens", "500", "--max-update", "3", "--save-dir", save_dir,
           "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation"])
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save_dir, "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 3
    return state, checkpoint_utils.load_checkpoint_to_cpu(checkpoint)["model"]


def assert_translates_test_split(data_dir: str, checkpoint: str, task_args: Sequence[str]):
    """fairseq-generate (beam 2) of ``checkpoint`` with ``task_args`` prints a
    hypothesis for every sentence of the test split of ``data_dir``."""
    out = generate([data_dir, "--path", checkpoint, *task_args, "--beam", "2",
                    "--max-tokens", "500", "--gen-subset", "test", "--num-workers", "0"])
    with open(os.path.join(data_dir, "test.docids")) as f:
        assert len(hypotheses(out)) == sum(1 for _ in f)


def write_two_documents(corpus_dir: str, path) -> Tuple[List[str], List[str]]:
    """fairseq-interactive input (``--input path``) from the raw test split of
    ``corpus_dir`` (``test.src``, ``test.docids``): the first three sentences
    of its first document, a blank line (a new document), then the first two
    sentences of the split outside that document; returns the two lists of
    sentences."""
    with open(os.path.join(corpus_dir, "test.src")) as f:
        src = f.read().splitlines()
    with open(os.path.join(corpus_dir, "test.docids")) as f:
        ids = f.read().splitlines()
    doc1 = [s for s, i in zip(src, ids) if i == ids[0]][:3]
    doc2 = [s for s, i in zip(src, ids) if i != ids[0]][:2]
    with open(path, "w") as f:
        f.write("\n".join(doc1) + "\n\n" + "\n".join(doc2) + "\n")
    return doc1, doc2


def interactive(argv: List[str], device: Optional[str] = None) -> str:
    """Run fairseq-interactive (``--input FILE`` in ``argv``); returns what it printed."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import interactive as fs_interactive

    args = cli_args(options.get_interactive_generation_parser(), argv, device)
    return printed(lambda: fs_interactive.main(convert_namespace_to_omegaconf(args)))


def run_main(main: Callable[[List[str]], None], argv: List[str], capsys):
    """Run a command line's ``main(argv)`` in-process: ``(exit status,
    stdout, stderr)`` (0 when it returns, its ``SystemExit`` code otherwise)."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


#: the dataset's arguments besides the spec
_DATASET_ARGS = ("separator", "tgt_context", "docids_path", "context_layout")
#: the tests' short names of ContextSpec fields
_SPEC_NAMES = {"src_context_size": "source_context_size",
               "tgt_context_size": "target_context_size", "direction": "context_direction",
               "sample_context_size": "sampled_context_size"}


def document_dataset(base, doc_ids, **kw):
    """A ``DocumentContextDataset`` from keyword settings: the spec's fields
    (also by the tests' short names: ``src_context_size``, ``direction``, ...;
    one previous source sentence unless told), ``max_src_context_tokens`` /
    ``max_tgt_context_tokens``, and the dataset's own arguments."""
    from ctx_fairseq.data.contract import ContextSpec
    from ctx_fairseq.data.document_dataset import DocumentContextDataset

    own = {k: kw.pop(k) for k in _DATASET_ARGS if k in kw}
    limits = {side: kw.pop(f"max_{side}_context_tokens", None) for side in ("src", "tgt")}
    fields = {_SPEC_NAMES.get(k, k): v for k, v in kw.items()}
    fields.setdefault("source_context_size", 1)
    if fields.get("document_context") is None:
        fields["document_context"] = "none"
    return DocumentContextDataset(base, doc_ids, ContextSpec(**fields),
                                  max_context_tokens=limits, **own)
