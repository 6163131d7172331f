"""Stage-2 updates for an equal target-token budget (the TVsub study).

    python budget.py TOKENS OUT_JSON -- FAIRSEQ_TRAIN_ARGS...

Builds the training split's batches exactly as ``fairseq-train`` with these
arguments builds them for epoch 1 (the task's dataset, the model's context
layout, ``--max-tokens`` counting the context), sums the target tokens of the
current sentences (the references the loss is on; for the concatenation
model without its target-context prefix) and prints the number of updates
that trains on ``TOKENS`` of them: ``ceil(TOKENS / (tokens / batches))``.
The context counts in ``--max-tokens``, so a context model's batch holds
fewer target tokens and it gets more updates: every model then sees the same
number of target tokens, not the same number of updates. A ``--doc2doc``
model's batches are of segments, each holding its sentences' target tokens
(a multi-resolution epoch holds each sentence once per resolution). The sampled context
size and the dropouts do not change the batches (they are built from the full
context's cost). ``OUT_JSON`` records the numbers.
"""

import json
import math
import os
import sys


def main(argv):
    if len(argv) < 3 or argv[2] != "--":
        sys.exit("usage: budget.py TOKENS OUT_JSON -- FAIRSEQ_TRAIN_ARGS...")
    tokens, out, train_args = int(argv[0]), argv[1], argv[3:]
    if tokens < 1:
        sys.exit("budget.py: error: TOKENS must be >= 1")
    import numpy as np
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, train_args)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    split = cfg.dataset.train_subset
    task.load_dataset(split, epoch=1, combine=False, data_selector=None)
    model = task.build_model(cfg.model)  # the document task takes the context layout from it
    ds = task.dataset(split)
    itr = task.get_batch_iterator(
        dataset=ds, max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(),
                                                  cfg.dataset.max_tokens),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_shards=1, shard_id=0, num_workers=0, epoch=1,
        data_buffer_size=0, disable_iterator_cache=True)
    batches = list(itr.frozen_batches)
    if hasattr(ds, "plan"):
        # --doc2doc segments (SegmentDataset): a batch's indices are segments, whose
        # target size is the sum of their sentences' (each </s> but the last a <sep>)
        sizes = np.asarray(ds.tgt_sizes, dtype=np.int64)
    else:
        # a context model's dataset: indices are sentences of the base dataset
        sizes = np.asarray(getattr(ds, "base", ds).tgt_sizes, dtype=np.int64)
    total = int(sum(int(sizes[np.asarray(b, dtype=np.int64)].sum()) for b in batches))
    per_batch = total / len(batches)
    updates = int(math.ceil(tokens / per_batch))
    rec = {"target_token_budget": tokens, "batches_per_epoch": len(batches),
           "target_tokens_per_epoch": total, "target_tokens_per_update": round(per_batch, 1),
           "updates": updates, "target_tokens_planned": round(updates * per_batch)}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".part", "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=2)
    os.replace(out + ".part", out)
    print(updates)


if __name__ == "__main__":
    main(sys.argv[1:])
