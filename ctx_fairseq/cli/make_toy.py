"""ctx-make-toy: write the synthetic discourse corpus (see ctx_fairseq.data.toy_corpus)."""

import argparse
import sys

from ctx_fairseq.data.toy_corpus import ToyCorpusError, make_toy_corpus


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctx-make-toy",
        description="Write a synthetic document-level corpus (src -> tgt) in which pronouns, "
        "lexical cohesion and local reordering need context: DIR/{train,valid,test}.{src,tgt}, "
        "DIR/{split}.docids, DIR/test.contrastive.jsonl and DIR/toy.json.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--docs", type=int, default=2000, help="training documents (default: 2000)")
    p.add_argument("--valid-docs", type=int, default=None,
                   help="validation documents (default: max(1, docs/10))")
    p.add_argument("--test-docs", type=int, default=None,
                   help="test documents (default: max(1, docs/10))")
    p.add_argument("--sents-per-doc", type=int, default=10,
                   help="sentences per document (default: 10)")
    p.add_argument("--max-distance", type=int, default=3,
                   help="maximum antecedent distance K in sentences (default: 3)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    return p


def cli_main(argv=None) -> None:
    parser = get_parser()
    args = parser.parse_args(argv)
    try:
        counts = make_toy_corpus(
            args.out, docs=args.docs, sents_per_doc=args.sents_per_doc,
            max_distance=args.max_distance, seed=args.seed,
            valid_docs=args.valid_docs, test_docs=args.test_docs,
        )
    except ToyCorpusError as err:
        parser.error(str(err))
    print(f"ctx-make-toy: wrote {args.out}: " + ", ".join(f"{k} {v} lines" for k, v in counts.items()))


if __name__ == "__main__":
    cli_main(sys.argv[1:])
