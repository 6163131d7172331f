import os

import pytest

from fairseq_cli_utils import preprocess


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
