import os
import re

import pytest

from fairseq_cli_utils import preprocess


@pytest.fixture(scope="module")
def one_thread():
    """The test machine's cores are shared: one intra-op thread is faster.
    A module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def accelerator():
    """The test runs the accelerator's path on the CPU (the CPU's shortcuts
    off: :func:`ctx_fairseq.modules.cpu_shortcuts.accelerator_path`). A module
    asks for it with ``pytestmark = pytest.mark.usefixtures("accelerator")``."""
    from ctx_fairseq.modules.cpu_shortcuts import accelerator_path

    with accelerator_path():
        yield


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory):
    """A small synthetic discourse corpus (raw text), made by ctx-make-toy's function."""
    from ctx_fairseq.data.toy_corpus import make_toy_corpus

    out = str(tmp_path_factory.mktemp("toy_raw"))
    make_toy_corpus(out, docs=60, sents_per_doc=8, max_distance=3, seed=1,
                    valid_docs=6, test_docs=6)
    return out


@pytest.fixture(scope="session")
def toy_bin(toy_corpus, tmp_path_factory):
    """The toy corpus binarized by fairseq-preprocess with a joined dictionary.
    Splits: train, valid, test; languages src -> tgt; ``{split}.docids`` copied."""
    import shutil

    dest = str(tmp_path_factory.mktemp("toy_bin"))
    preprocess(
        ["--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", os.path.join(toy_corpus, "train"),
         "--validpref", os.path.join(toy_corpus, "valid"),
         "--testpref", os.path.join(toy_corpus, "test"),
         "--destdir", dest, "--joined-dictionary", "--workers", "1"]
    )
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(toy_corpus, f"{split}.docids"), dest)
    return dest


DOC_ARGS = ["--task", "document_translation", "--source-context-size", "1"]


@pytest.fixture(scope="session")
def sentence_ckpt(toy_bin, tmp_path_factory):
    """A sentence-level transformer trained 2 updates on the toy corpus."""
    from fairseq_cli_utils import TINY_MODEL_ARGS, train

    save = str(tmp_path_factory.mktemp("sent"))
    train([toy_bin, "--arch", "transformer", *TINY_MODEL_ARGS, "--share-all-embeddings",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="session")
def context_ckpt(toy_bin, sentence_ckpt, tmp_path_factory):
    """Two-stage: transformer_context_aware initialised from the sentence
    checkpoint, trained 3 updates, then beam-searched through fairseq-generate."""
    from fairseq_cli_utils import train_and_generate

    save = str(tmp_path_factory.mktemp("ctx"))
    out = train_and_generate(
        toy_bin, save, "transformer_context_aware",
        extra=[*DOC_ARGS, "--share-all-embeddings", "--init-from-sentence-checkpoint",
               sentence_ckpt],
        gen_extra=DOC_ARGS)
    return os.path.join(save, "checkpoint_last.pt"), out


SELECTIVE_DEC_ARGS = ["--task", "document_translation", "--document-context", "online",
                      "--document-memory", "--target-context-size", "1"]


@pytest.fixture(scope="session")
def selective_dec_ckpt(toy_bin, sentence_ckpt, tmp_path_factory):
    """transformer_selective_doc_dec (decoder integration, online) as the
    architecture defines it (the paper's: frozen memory from the stage-1
    model), initialised from ``sentence_ckpt`` and trained 2 updates."""
    from fairseq_cli_utils import TINY_MODEL_ARGS, train

    save = str(tmp_path_factory.mktemp("seldec"))
    train([toy_bin, "--arch", "transformer_selective_doc_dec", *TINY_MODEL_ARGS,
           *SELECTIVE_DEC_ARGS, "--init-from-sentence-checkpoint", sentence_ckpt,
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "600", "--max-update", "2", "--save-dir", save, "--no-progress-bar",
           "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0", "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


#: tests whose name says they check that two computations agree exactly (a
#: batch grouped or padded against the whole, step by step against the full
#: forward, the CPU's shortcuts against the accelerator's path, float64
#: against a reference): marked ``exactness`` besides the files that mark
#: themselves, so that .ci/run runs them again under ATEN_CPU_CAPABILITY=default
EXACTNESS_NAMES = re.compile(
    r"padding_invarian|padding|incremental_equals|step_by_step|grouped_equals|"
    r"does_not_depend|bitwise|shortcuts|real_positions_equal|float64|_equals_fairseq|"
    r"one_document_(vs|against)|unaffected|matches_naive|matches_reference")


#: the files of the models' and modules' own tests (not the tools'), where those names
#: mean an equality of two computations
EXACTNESS_FILES = re.compile(r"test_(transformer_|selective_|real_token|context_aware|compat|"
                             r"length_buckets|dc_analysis)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if EXACTNESS_FILES.match(os.path.basename(str(item.fspath))) and \
                EXACTNESS_NAMES.search(item.originalname or item.name):
            item.add_marker(pytest.mark.exactness)
