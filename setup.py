"""ctx-fairseq: a fairseq --user-dir plugin for context-aware NMT.

fairseq itself is not listed in install_requires: the maintained fork we use
(``ve-fairseq``) declares ``torchaudio`` as a dependency, and resolving that on
a CPU-only machine pulls the newest CUDA build of torch (gigabytes).
``scripts/install.sh`` installs torch and the fork first (the fork with
``--no-deps``) and then this package, whose requirements below include the
fork's real runtime dependencies. See README.md, "Installation".
"""

from setuptools import find_packages, setup

FAIRSEQ_RUNTIME_DEPS = [
    "cffi",
    "cython",
    "hydra-core>=1.3.2",
    "omegaconf>=2.1",
    "numpy>=1.21.3",
    "regex",
    "tqdm",
    "bitarray",
    "scikit-learn",
    "packaging",
]

setup(
    name="ctx-fairseq",
    version="0.1.0",
    description="Local/global and document-level context for fairseq NMT",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["ctx_fairseq", "ctx_fairseq.*"]),
    install_requires=FAIRSEQ_RUNTIME_DEPS
    + [
        "torch>=2.0",
        "sacrebleu>=2.0",
        "subword-nmt",
        "sacremoses",
        "entmax>=1.1",
        "matplotlib",
    ],
    extras_require={"test": ["pytest"]},
    entry_points={
        "console_scripts": [
            "ctx-make-toy = ctx_fairseq.cli.make_toy:cli_main",
            "ctx-demo = ctx_fairseq.cli.demo:cli_main",
            "ctx-bench = ctx_fairseq.cli.bench:cli_main",
            "ctx-score-contrastive = ctx_fairseq.cli.entry_points:score_contrastive",
            "ctx-prep-docs = ctx_fairseq.prep.docs:cli_main",
            "ctx-dc-jsd = ctx_fairseq.cli.entry_points:dc_jsd",
            "ctx-bleu-by-length = ctx_fairseq.cli.entry_points:bleu_by_length",
            "ctx-dc-params = ctx_fairseq.models.transformer_dc:params_cli_main",
            "ctx-hybrid-gates = ctx_fairseq.cli.entry_points:hybrid_gates",
            "ctx-context-aware-analysis = ctx_fairseq.cli.entry_points:context_aware_analysis",
            "ctx-iterative-decode = ctx_fairseq.cli.iterative_decode:cli_main",
            "ctx-selective-analysis = ctx_fairseq.eval.analyses.selective_analysis:main",
            "ctx-doc-bleu = ctx_fairseq.eval.scoring.doc_bleu:cli_main",
            "ctx-doc2doc-split = ctx_fairseq.cli.doc2doc_split:cli_main",
            "ctx-probe = ctx_fairseq.eval.analyses.probe:cli_main",
            "ctx-prep-corpora = ctx_fairseq.prep.corpora:cli_main",
            "ctx-make-pronoun-suite = ctx_fairseq.eval.scoring.make_pronoun_suite:cli_main",
            "ctx-cxmi = ctx_fairseq.cli.entry_points:cxmi",
            "ctx-generative-accuracy = ctx_fairseq.cli.entry_points:generative_accuracy",
            "ctx-dp-eval = ctx_fairseq.eval.pronouns.dp_eval:cli_main",
            "ctx-dp-suite = ctx_fairseq.eval.pronouns.dp_suite:cli_main",
        ]
    },
)
