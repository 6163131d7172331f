"""Issue 18, defect 1: the batches the task re-collates at generation
(``--own-target-context``, fairseq-interactive with context, ``--score-reference``)
reach the generator with every tensor on the device of the batch fairseq gave
the task. On CUDA a re-collated batch whose ``id`` (or ``target``) stayed on
the CPU failed inside fairseq's generator; here the GPU is simulated on the
CPU (``tests/other_device.py``): the model and the batch are put on another
device, the generator asserts that everything it gets is there (and any CPU
tensor mixed with the device's raises, as on CUDA), and the translations
equal those of the plain CPU run."""

import numpy as np
import pytest
import torch

from fairseq_cli_utils import TINY_MODEL_ARGS
from other_device import OtherDeviceMode, checked_generator, to_other

pytestmark = pytest.mark.usefixtures("one_thread")

OWN = ["--task", "document_translation", "--own-target-context"]
CASES = {
    "concat": ("transformer", OWN + ["--concat-context", "--source-context-size", "1",
                                     "--target-context-size", "1"]),
    "han": ("transformer_han", OWN + ["--source-context-size", "3", "--target-context-size", "3"]),
    "selective_dec": ("transformer_selective_doc_dec",
                      OWN + ["--document-context", "online", "--document-memory",
                             "--target-context-size", "1"]),
}


def _model_args(arch, sentence_ckpt):
    """Whole-document models take their (frozen) memory from a stage-1
    sentence-level model by default."""
    return ["--init-from-sentence-checkpoint", sentence_ckpt] if "selective" in arch else []


def _task_and_model(toy_bin, arch, task_args, model=None, init=()):
    from fairseq import options, tasks

    import ctx_fairseq  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_bin, "--arch", arch, *TINY_MODEL_ARGS, "--share-all-embeddings", "--dropout", "0",
        *task_args, *init])
    task = tasks.setup_task(args)
    if model is None:
        torch.manual_seed(0)
        model = task.build_model(args).double().eval()  # see _translate
    task.load_dataset("test", task_cfg=task.cfg)  # as fairseq-generate loads it
    return task, model


def _generator(task, model, gen_args):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_generation_parser(), ["/dev/null", *gen_args])
    return task.build_generator([model], convert_namespace_to_omegaconf(args).generation)


def _batches(task, model, max_tokens=600):
    from fairseq import utils

    itr = task.get_batch_iterator(
        dataset=task.dataset("test"), max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        num_workers=0).next_epoch_itr(shuffle=False)
    return list(itr)


def _on_other(model):
    """A copy of ``model`` on ``OTHER`` (the CPU model stays for the reference run)."""
    import copy

    from other_device import OTHER

    with OtherDeviceMode():
        return copy.deepcopy(model).to(OTHER)


def _cpu(x):
    return x.cpu() if torch.is_tensor(x) else x


def _translate(toy_bin, arch, task_args, gen_args, other, model=None, init=()):
    """``{id: (tokens, score)}`` of the best hypotheses, the model and the
    batches on ``OTHER`` (``other``) or on the CPU. The models are in float64:
    composite ops (attention) choose their kernels by the device they are
    given, so the simulated device computes with other kernels than the CPU,
    ~1e-6 apart in float32, enough to flip the near-ties of an untrained
    model's beam search; in float64 the translations must be identical."""
    task, model = _task_and_model(toy_bin, arch, task_args, model, init)
    batches = _batches(task, model)
    if other:
        model = _on_other(model)
    gen = _generator(task, model, gen_args)
    calls = []
    if other:
        checked_generator(gen, calls)
    out = {}
    with torch.no_grad():
        for sample in batches:
            ids = sample["id"].tolist()
            if other:
                with OtherDeviceMode():
                    hyps = task.inference_step(gen, [model], to_other(sample))
            else:
                hyps = task.inference_step(gen, [model], sample)
            for i, h in zip(ids, hyps):
                out[i] = (_cpu(h[0]["tokens"]).tolist(), float(_cpu(h[0]["score"])))
    return out, model, calls


@pytest.mark.parametrize("case", sorted(CASES))
def test_own_target_context_batches_stay_on_the_device(toy_bin, sentence_ckpt, case):
    arch, task_args = CASES[case]
    gen = ["--beam", "2", "--max-len-b", "4"]
    on_cpu, model, _ = _translate(toy_bin, arch, task_args, gen, other=False,
                                  init=_model_args(arch, sentence_ckpt))
    on_other, _, calls = _translate(toy_bin, arch, task_args, gen, other=True, model=model)
    assert calls and sorted(on_other) == sorted(on_cpu) and len(on_cpu) == 48
    for i in on_cpu:
        assert on_other[i][0] == on_cpu[i][0], i
        assert on_other[i][1] == pytest.approx(on_cpu[i][1], abs=1e-5), i


def test_score_reference_with_own_target_context_stays_on_the_device(toy_bin, sentence_ckpt):
    """fairseq's scorer reads ``target``: a re-collated batch must carry it on
    the device too."""
    arch, task_args = CASES["selective_dec"]
    gen = ["--score-reference"]
    on_cpu, model, _ = _translate(toy_bin, arch, task_args, gen, other=False,
                                  init=_model_args(arch, sentence_ckpt))
    on_other, _, calls = _translate(toy_bin, arch, task_args, gen, other=True, model=model)
    assert calls and on_other.keys() == on_cpu.keys()
    for i in on_cpu:
        assert on_other[i][0] == on_cpu[i][0]
        assert on_other[i][1] == pytest.approx(on_cpu[i][1], abs=1e-5)


@pytest.mark.parametrize("target_context", [0, 1])
def test_interactive_batches_of_several_sentences_stay_on_the_device(toy_bin, toy_corpus,
                                                                      sentence_ckpt,
                                                                      target_context):
    """fairseq-interactive hands the task a batch of source tokens only (on
    the GPU); the task restores its context inputs and ``id`` (two or more
    sentences per batch; with target context, one sentence at a time)."""
    import os

    if target_context:
        arch = "transformer_selective_doc_dec"
        task_args = ["--task", "document_translation", "--document-context", "online",
                     "--document-memory", "--target-context-size", "1"]
    else:
        arch, task_args = "transformer_context_aware", ["--task", "document_translation",
                                                        "--source-context-size", "1"]
    src = open(os.path.join(toy_corpus, "test.src")).read().splitlines()[:4]

    def run(other, model=None):
        from fairseq import options, tasks

        import ctx_fairseq  # noqa: F401

        args = options.parse_args_and_arch(options.get_training_parser(), [
            toy_bin, "--arch", arch, *TINY_MODEL_ARGS, "--share-all-embeddings", "--dropout",
            "0", *task_args, *_model_args(arch, sentence_ckpt)])
        task = tasks.setup_task(args)
        if model is None:
            torch.manual_seed(0)
            model = task.build_model(args).double().eval()  # see _translate
        cpu_model = model
        if other:
            model = _on_other(model)
        gen = _generator(task, model, ["--beam", "2", "--max-len-b", "5"])
        calls = []
        if other:
            checked_generator(gen, calls)
        d = task.source_dictionary
        tokens = [d.encode_line(s, add_if_not_exist=False).long() for s in src]
        ds = task.build_dataset_for_inference(tokens, [t.numel() for t in tokens])
        itr = task.get_batch_iterator(dataset=ds, max_sentences=4,
                                      num_workers=0).next_epoch_itr(shuffle=False)
        out = {}
        with torch.no_grad():
            for batch in itr:
                # what fairseq-interactive hands the task: the source tokens only
                sample = {"net_input": {"src_tokens": batch["net_input"]["src_tokens"],
                                        "src_lengths": batch["net_input"]["src_lengths"]}}
                if other:
                    with OtherDeviceMode():
                        hyps = task.inference_step(gen, [model], to_other(sample))
                else:
                    hyps = task.inference_step(gen, [model], sample)
                for i, h in zip(batch["id"].tolist(), hyps):
                    out[i] = _cpu(h[0]["tokens"]).tolist()
        return out, cpu_model, calls

    on_cpu, model, _ = run(False)
    on_other, _, calls = run(True, model)
    assert on_other == on_cpu and sorted(on_cpu) == [0, 1, 2, 3]
    assert max(len(c) for c in calls) == (1 if target_context else 4)


def test_the_simulated_device_catches_a_cpu_tensor():
    """The check itself: a batch with ``id`` left on the CPU is refused, and a
    CPU tensor indexed by device indices raises as on CUDA."""
    from other_device import OTHER

    class Gen:
        def generate(self, models, sample, prefix_tokens=None, constraints=None):
            return []

    gen = checked_generator(Gen())
    sample = to_other({"id": torch.arange(2), "net_input": {"src_tokens": torch.ones(2, 3)}})
    gen.generate(None, sample)
    sample["id"] = torch.arange(2)
    with pytest.raises(AssertionError, match=r"sample\['id'\]"):
        gen.generate(None, sample)
    with OtherDeviceMode():
        idx = torch.tensor([1]).to(OTHER)
        with pytest.raises(RuntimeError, match="same device"):
            torch.arange(3)[idx]
        assert torch.arange(3).to(OTHER)[torch.tensor([1])].tolist() == [1]
        assert np.array_equal(torch.arange(3).to(OTHER).cpu().numpy(), np.arange(3))


@pytest.mark.parametrize("case", ["concat", "han"])
def test_own_target_context_reads_back_once_per_position(toy_bin, case):
    """The best hypotheses of a document position are copied to the host in
    one copy (it was one per sentence), counted on the simulated device where
    ``.cpu()`` is a read as on a GPU; concatenation reads no prefix lengths
    back (they are known on the CPU)."""
    from ctx_fairseq.host_reads import HostReadCounter

    arch, task_args = CASES[case]
    task, model = _task_and_model(toy_bin, arch, task_args)
    batches = _batches(task, model)
    ds = task.dataset("test")
    model = _on_other(model)
    gen = _generator(task, model, ["--beam", "2", "--max-len-b", "4"])
    positions = 0
    with torch.no_grad(), OtherDeviceMode():
        with HostReadCounter() as reads:
            for sample in batches:
                positions += len(set(ds.sent_pos[sample["id"].numpy()].tolist()))
                task.inference_step(gen, [model], to_other(sample))
    assert positions > len(batches)
    assert reads.by_op["cpu"] == positions, dict(reads.by_op)
