"""Contrastive evaluation: does the model score the correct translation above
each contrastive one (same sentence, wrong context-dependent word)?

Reads the JSON Lines format written by ``ctx-make-toy``
(``test.contrastive.jsonl``, documented in :mod:`ctx_fairseq.data.toy_corpus`):
each record has ``src``, ``ref``, ``contrastive`` (a list), ``phenomenon``
and ``distance``. Sentences are scored by the sum of target token
log-probabilities under teacher forcing (fairseq's usual
``get_normalized_probs``), for an ensemble of one checkpoint. A record counts
as correct when ``ref`` scores strictly higher than every contrastive target.

Sentences are used as they are in the file (whitespace tokens): apply the
same tokenisation/BPE as the training data before scoring real data.
A checkpoint trained with ``--task document_translation`` and context is
scored with the context it was trained with, built by the task from the
records' documents (``id`` = line of the split, ``doc_id`` checked):
:func:`ctx_fairseq.eval.context_aware_analysis.contrastive_with_context`;
never silently without it. Sentence-level checkpoints use the path below.

Console script: ``ctx-score-contrastive --path CKPT --data BIN --contrastive FILE``.
"""

import argparse
import collections
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ctx_fairseq.data.toy_corpus import read_contrastive


def _encode(dictionary, sentence: str) -> torch.Tensor:
    return dictionary.encode_line(sentence, add_if_not_exist=False, append_eos=True).long()


@torch.no_grad()
def score_pairs(model, task, sources: Sequence[str], targets: Sequence[str],
                batch_size: int = 64,
                extra_net_input: Optional[Callable[[int, int], Dict[str, torch.Tensor]]] = None,
                ) -> List[float]:
    """Sum of log p(target | source) for each (source, target) pair.

    ``extra_net_input(start, end)``, when given, returns further ``net_input``
    tensors (e.g. document context, one row per pair) for pairs
    ``start:end``."""
    from fairseq.data import data_utils

    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    device = next(model.parameters()).device
    scores: List[float] = []
    for start in range(0, len(sources), batch_size):
        src = [_encode(src_dict, s) for s in sources[start:start + batch_size]]
        tgt = [_encode(tgt_dict, t) for t in targets[start:start + batch_size]]
        src_tokens = data_utils.collate_tokens(src, src_dict.pad(), src_dict.eos(), left_pad=True)
        src_lengths = torch.tensor([s.numel() for s in src])
        target = data_utils.collate_tokens(tgt, tgt_dict.pad(), tgt_dict.eos(), left_pad=False)
        prev = data_utils.collate_tokens(tgt, tgt_dict.pad(), tgt_dict.eos(), left_pad=False,
                                         move_eos_to_beginning=True)
        extra = {}
        if extra_net_input is not None:
            extra = {k: v.to(device) for k, v in
                     extra_net_input(start, start + len(src)).items()}
        net_output = model(src_tokens.to(device), src_lengths.to(device), prev.to(device), **extra)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        target = target.to(device)
        tok = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        tok = tok.masked_fill(target.eq(tgt_dict.pad()), 0.0)
        scores.extend(tok.sum(-1).tolist())
    return scores


def evaluate(model, task, records: Sequence[dict], batch_size: int = 64,
             extra_net_input: Optional[Callable[[Sequence[int]], Dict[str, torch.Tensor]]] = None,
             ) -> Dict:
    """Accuracy overall, per phenomenon and per (phenomenon, distance).

    ``extra_net_input(record_indices)``, when given, returns further
    ``net_input`` tensors for a batch of pairs, one row per pair, given the
    index (into ``records``) of each pair's record."""
    sources, targets, owner = [], [], []
    for i, rec in enumerate(records):
        for tgt in [rec["ref"], *rec["contrastive"]]:
            sources.append(rec["src"])
            targets.append(tgt)
            owner.append(i)
    extra = None
    if extra_net_input is not None:
        extra = lambda start, end: extra_net_input(owner[start:end])  # noqa: E731
    scores = score_pairs(model, task, sources, targets, batch_size, extra)
    per_record = collections.defaultdict(list)
    for i, s in zip(owner, scores):
        per_record[i].append(s)
    correct = [all(s[0] > c for c in s[1:]) for _, s in sorted(per_record.items())]

    def acc(mask):
        n = sum(mask)
        return {"n": n, "accuracy": (sum(c for c, m in zip(correct, mask) if m) / n) if n else None}

    result = {"overall": acc([True] * len(records)), "by_phenomenon": {}, "by_distance": {}}
    for ph in sorted({r["phenomenon"] for r in records}):
        result["by_phenomenon"][ph] = acc([r["phenomenon"] == ph for r in records])
        result["by_distance"][ph] = {
            str(d): acc([r["phenomenon"] == ph and r["distance"] == d for r in records])
            for d in sorted({r["distance"] for r in records if r["phenomenon"] == ph})
        }
    return result


def load_model(path: str, data: str, cpu: bool = True):
    import ctx_fairseq  # noqa: F401
    from fairseq import checkpoint_utils

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data}
    )
    model = models[0].eval()
    if not cpu and torch.cuda.is_available():
        model = model.cuda()
    return model, task


def evaluate_checkpoint(path: str, data: str, contrastive: str, cpu: bool = True,
                        ablation: str = "none", split: str = "test",
                        gold_target_context: bool = False) -> Dict:
    """Contrastive accuracy of a checkpoint; document-level checkpoints get
    their context (see the module docstring)."""
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    records = read_contrastive(contrastive)
    model, task = load_model(path, data, cpu=cpu)
    if isinstance(task, DocumentTranslationTask) and task.uses_context:
        from ctx_fairseq.eval.context_aware_analysis import contrastive_with_context

        return contrastive_with_context(path, data, contrastive, ablation=ablation, split=split,
                                        cpu=cpu, gold_target_context=gold_target_context)
    if ablation != "none":
        raise ValueError(f"--context-ablation {ablation}: {path} is a sentence-level checkpoint "
                         "(no context to ablate)")
    return evaluate(model, task, records)


def format_result(result: Dict) -> str:
    lines = [f"overall: {result['overall']['accuracy']:.3f} (n={result['overall']['n']})"]
    for ph, res in result["by_phenomenon"].items():
        dist = ", ".join(f"d={d}: {r['accuracy']:.3f}" for d, r in result["by_distance"][ph].items())
        lines.append(f"{ph}: {res['accuracy']:.3f} (n={res['n']}; {dist})")
    return "\n".join(lines)


def cli_main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="ctx-score-contrastive", description=__doc__.split("\n\n")[0])
    p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--data", required=True, help="binarized data directory (dictionaries)")
    p.add_argument("--contrastive", required=True, help="contrastive JSON Lines file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--cuda", action="store_true", help="score on the GPU")
    p.add_argument("--split", default="test",
                   help="document-level checkpoints: the split the records' ids refer to")
    p.add_argument("--context-ablation", default="none", choices=["none", "shuffled", "random"],
                   help="document-level checkpoints: score with wrong context (Voita et al.)")
    p.add_argument("--gold-target-context", action="store_true",
                   help="checkpoints with target context: take it from the references")
    args = p.parse_args(argv)
    try:
        result = evaluate_checkpoint(args.path, args.data, args.contrastive, cpu=not args.cuda,
                                     ablation=args.context_ablation, split=args.split,
                                     gold_target_context=args.gold_target_context)
    except (OSError, ValueError) as err:
        p.error(str(err))
    print(json.dumps(result, indent=2) if args.json else format_result(result))


if __name__ == "__main__":
    cli_main(sys.argv[1:])
