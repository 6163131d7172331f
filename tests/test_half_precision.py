"""Half precision for every architecture of the plugin (issue 18).

For every architecture registered by ``ctx_fairseq`` (found in fairseq's
registry, presets included, so that a new one is checked without being listed
here), on one training batch that the architecture's own task makes from the
toy corpus (ctx-demo's ``train_args``, ``ctx_fairseq.cli.arch_hooks``: the document task and its context options for
the context models; fairseq's translation task otherwise), with the criterion
ctx-demo trains with (label-smoothed cross-entropy, 0.1) and dropout off:

* **cast** (what ``fairseq-train --fp16`` does: ``model.half()``; on the CPU
  the model is cast to float16 too, every op these models use has a CPU
  float16 kernel in the torch this was written for): a finite loss, finite
  gradients that are not all zero, and a per-token loss within
  ``LOSS_TOLERANCE`` of the float32 model's (the same weights, rounded to
  float16, so that the difference is the arithmetic's), gradients within
  ``GRAD_TOLERANCE`` (relative L2 norm) of float32's;
* **autocast** (``fairseq-train --amp``, ``ctx-bench --fp16``): the float32
  model under ``torch.autocast``, bfloat16 on the CPU (the dtype CPU autocast is
  made for) and float16 on CUDA; the same checks against the float32 model on
  the same weights.

On CUDA (when present) both run on the GPU in float16. Besides the registry's
architectures, ``VARIANTS`` checks options that change the arithmetic (every
hybrid mode, Full-DC with f = 3 and pre-norm). Tolerances are per token of the
loss (5-6 nats per token on this data at initialisation) and set from the
measured differences (next to ``LOSS_TOLERANCE``) with a margin; a mask fill
that overflows (NaN) or a value computed in the wrong precision misses them by
orders of magnitude. Architectures that fail for code outside the files of the
change that added this test are marked ``xfail(strict=True)`` in
``KNOWN_FAILURES`` with the file and line.

``test_no_fill_overflows_half_precision`` scans the package's source (its
AST) for constant fill values outside float16's range that no dtype condition
guards (``masked_fill(m, -1e9)`` and the like).
"""

import os
import re

import pytest
import torch

from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import ctx_fairseq  # noqa: F401  (registers every model)
from ctx_fairseq._registry import plugin_architectures
from fairseq_cli_utils import REPO_ROOT, TINY_MODEL_ARGS

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
CAST_DTYPE = torch.float16
AUTOCAST_DTYPE = torch.float16 if CUDA else torch.bfloat16

# |loss_half - loss_fp32| per target token (nats), and ||g_half - g_fp32|| / ||g_fp32||.
# Measured on the CPU (torch 2.13), every architecture: cast <= 0.00014 nats and
# <= 0.0064; bfloat16 autocast <= 0.0014 nats and <= 0.0134.
LOSS_TOLERANCE = {"cast": 0.005, "autocast": 0.01}
GRAD_TOLERANCE = {"cast": 0.03, "autocast": 0.05}

# Options that change the arithmetic of an architecture beyond its presets:
# (architecture, options, id suffix), checked like the architectures.
VARIANTS = [
    *[("transformer_hybrid", ["--hybrid-mode", mode, "--hybrid-decoder-layers", "all"], mode)
      for mode in ("concat", "local", "gauss-window", "gauss-center", "gauss-both")],
    ("transformer_hybrid", ["--hybrid-gate-per-head", "--hybrid-decoder-layers", "all"],
     "gate-per-head"),
    # the selective models' default is the paper's frozen memory (no backward through
    # it); the memory computed with gradients by the model itself:
    *[(arch, ["--context-memory", "shared"], "shared")
      for arch in ("transformer_selective_doc", "transformer_selective_doc_dec")],
    ("transformer_dc_full", ["--dc-kernel-size", "3", "--encoder-normalize-before",
                             "--decoder-normalize-before"], "f3-prenorm"),
]

# (architecture, mode) -> why it fails for code outside this helper's files.
# xfail(strict): the test fails as soon as it passes, so that the entry goes.
KNOWN_FAILURES = {}


def _train_argv(arch, sentence_ckpt):
    """The task options ctx-demo trains ``arch`` with (its ``DemoHooks``
    ``train_args``; fairseq's translation task for a sentence-level model),
    initialised from a sentence-level checkpoint where ctx-demo trains one
    first (``stage1``)."""
    from ctx_fairseq.cli.arch_hooks import demo_hooks

    hooks = demo_hooks(arch)
    argv = hooks.train_args_for(arch)
    if "--task" not in argv:
        argv = ["--task", "translation", *argv]
    if hooks.stage1:
        argv += ["--init-from-sentence-checkpoint", sentence_ckpt]
    return argv


_SETUPS = {}


def _setup(arch, extra, toy_bin, sentence_ckpt):
    """``(task, model (float32, on the CPU), criterion, sample)``: built as
    fairseq-train builds them (``extra``: more options), cached."""
    key = (arch, tuple(extra))
    if key not in _SETUPS:
        args = options.parse_args_and_arch(
            options.get_training_parser(),
            [toy_bin, "--arch", arch, *_train_argv(arch, sentence_ckpt), *TINY_MODEL_ARGS,
             *extra,
             "--share-all-embeddings", "--dropout", "0", "--attention-dropout", "0",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", "300", "--seed", "1", "--num-workers", "0"])
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        task.load_dataset("valid")
        torch.manual_seed(1)
        model = task.build_model(cfg.model)
        criterion = task.build_criterion(cfg.criterion)
        itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=300, seed=1,
                                      disable_iterator_cache=True)
        sample = next(iter(itr.next_epoch_itr(shuffle=False)))
        _SETUPS[key] = (task, model, criterion, sample)
    return _SETUPS[key]


def _to(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample) if device.type == "cuda" else sample


def _loss_and_grads(model, criterion, sample, autocast_dtype=None):
    """Per-token loss (float) and the flat float32 gradient of one training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE.type, dtype=autocast_dtype or torch.float32,
                        enabled=autocast_dtype is not None):
        loss, sample_size, _ = criterion(model, sample)
    loss.backward()
    grads = [p.grad.detach().float().flatten() for p in model.parameters()
             if p.grad is not None]
    return loss.detach().float() / sample_size, torch.cat(grads)


def _check(arch, extra, data, mode):
    task, model, criterion, sample = _setup(arch, extra, *data)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sample = _to(sample, DEVICE)
    try:
        if mode == "cast":
            # the float32 reference on the weights rounded to float16
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(CAST_DTYPE).float())
            model.to(DEVICE)
            ref_loss, ref_grad = _loss_and_grads(model, criterion, sample)
            model.to(CAST_DTYPE)
            loss, grad = _loss_and_grads(model, criterion, sample)
        else:
            model.to(DEVICE)
            ref_loss, ref_grad = _loss_and_grads(model, criterion, sample)
            loss, grad = _loss_and_grads(model, criterion, sample, AUTOCAST_DTYPE)
    finally:
        model.float().cpu().load_state_dict(state)
    assert torch.isfinite(ref_loss) and torch.isfinite(ref_grad).all()
    assert torch.isfinite(loss), (arch, mode, loss)
    bad = (~torch.isfinite(grad)).sum().item()
    assert bad == 0, f"{arch} {mode}: {bad} non-finite gradient entries"
    assert grad.abs().max() > 0, f"{arch} {mode}: every gradient is zero"
    dl = (loss - ref_loss).abs().item()
    dg = ((grad - ref_grad).norm() / ref_grad.norm()).item()
    print(f"{arch} {mode}: loss {ref_loss.item():.4f} vs {loss.item():.4f} (|d| {dl:.5f}), "
          f"grad rel {dg:.5f}")
    assert dl <= LOSS_TOLERANCE[mode], (arch, mode, dl)
    assert dg <= GRAD_TOLERANCE[mode], (arch, mode, dg)


def _params(mode):
    out = []
    cases = [(arch, [], arch) for arch in plugin_architectures()]
    cases += [(arch, extra, f"{arch}-{suffix}") for arch, extra, suffix in VARIANTS]
    for arch, extra, name in cases:
        marks = []
        if (arch, mode) in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, raises=RuntimeError,
                                           reason=KNOWN_FAILURES[arch, mode]))
        out.append(pytest.param(arch, extra, id=name, marks=marks))
    return out


def test_every_architecture_is_checked():
    """The parametrisation comes from fairseq's registry: every architecture the
    plugin registers (presets included) is in both tests."""
    archs = plugin_architectures()
    assert len(archs) >= 20 and "transformer_dc" in archs and "transformer_han" in archs
    for mode in ("cast", "autocast"):
        assert {p.values[0] for p in _params(mode)} == set(archs)


@pytest.mark.parametrize("arch, extra", _params("cast"))
def test_model_cast_to_half_trains(arch, extra, toy_bin, sentence_ckpt):
    """``model.half()`` (``fairseq-train --fp16``): finite loss and gradients,
    close to float32 on the same (rounded) weights."""
    _check(arch, extra, (toy_bin, sentence_ckpt), "cast")


@pytest.mark.parametrize("arch, extra", _params("autocast"))
def test_autocast_trains(arch, extra, toy_bin, sentence_ckpt):
    """``torch.autocast`` (bfloat16 on the CPU, float16 on CUDA): finite loss and
    gradients, close to float32."""
    _check(arch, extra, (toy_bin, sentence_ckpt), "autocast")


# ------------------------------------------------------------------ mask fills
FILL_CALLS = {"masked_fill", "masked_fill_", "fill_", "full", "full_like", "new_full",
              "where", "clamp", "clamp_", "clamp_min", "fill_diagonal_", "constant_pad_nd",
              "pad"}


def _fill_constants(node, guarded=False):
    """``(value, guarded)`` for each numeric constant an argument can evaluate to:
    a literal, ``-literal``, ``float("...")``, or either branch of a conditional
    (``guarded`` when the condition looks at a dtype)."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        yield float(node.value), guarded
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        for v, g in _fill_constants(node.operand, guarded):
            yield -v, g
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id == "float" and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        yield float(node.args[0].value), guarded
    elif isinstance(node, ast.IfExp):
        g = guarded or "dtype" in ast.unparse(node.test)
        yield from _fill_constants(node.body, g)
        yield from _fill_constants(node.orelse, g)


def fill_sites(root):
    """Every fill call of the package with a constant fill value:
    ``(path:line, value, guarded)``."""
    import ast

    out = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if fname not in FILL_CALLS:
                    continue
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    for value, guarded in _fill_constants(arg):
                        where = f"{os.path.relpath(path, REPO_ROOT)}:{node.lineno}"
                        out.append((where, value, guarded))
    return out


def test_no_fill_overflows_half_precision():
    """No mask or fill value of the package lies outside float16's range
    (|v| > 65504: 1e9, -1e8, ...) unless a dtype condition picks it (as
    ``attention_bias``'s ``-1e8 if float32 else -1e4``): written into a float16
    tensor it would become ``-inf``, and a query whose keys are all masked then
    gets NaN. ``+-inf`` fills are listed when run with ``-s`` (a fully masked row
    must be handled where they are used)."""
    big = torch.finfo(torch.float16).max
    sites = fill_sites(os.path.join(REPO_ROOT, "ctx_fairseq"))
    assert sites  # the scan sees the package's fills
    bad = [(w, v) for w, v, g in sites if v == v and abs(v) != float("inf") and abs(v) > big
           and not g]
    assert not bad, f"fills outside float16's range: {bad}"
    for w, v, _ in sites:
        if abs(v) == float("inf"):
            print(f"infinite fill: {w} {v}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_bias_fits_the_autocast_dtype(dtype):
    """Under autocast the encoder layers' additive mask is -1e4 (the energies are
    half precision, where -1e8 is -inf), -1e8 in float32, as fairseq's layer."""
    from ctx_fairseq.modules.encoder_sublayers import attention_bias

    mask = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    x = torch.zeros(2, 1, 4)
    assert attention_bias(mask, x).min() == -1e8
    with torch.autocast("cpu", dtype=dtype):
        bias = attention_bias(mask, x)
    assert bias.min() == -1e4 and torch.isfinite(bias.to(torch.float16)).all()
    assert attention_bias(mask, x.half()).min() == -1e4
