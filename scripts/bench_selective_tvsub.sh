#!/usr/bin/env bash
# Selective attention (exact word level) against the transformer on the TVsub
# study's data and shape, on the CPU: what fairseq-train itself runs.
#
#   scripts/bench_selective_tvsub.sh DATA_BIN OUT_DIR
#
# DATA_BIN: a TVsub data-bin made by the recipe (UNTIL=data recipes/tvsub_zh_en/run.sh
# --study ...: binarized episodes with train.docids; BENCHMARKS.md's figures were
# measured on EPISODES=0:60, the study's default until 2026-11-27). Writes under OUT_DIR:
#   stage1/            a transformer of the study's shape after 2 updates (the
#                      frozen memory's stage-1 model: speed only, not quality)
#   selective.log, transformer.log
#                      N (default 30) updates each of fairseq-train with the
#                      stage-2 options of the recipe's --study (its shape, batch
#                      size, learning rate, dropouts and CoWord dropout; 1 thread),
#                      logged every 10 updates (wps: target tokens/s)
#   episode.json       one training step on the batch with the largest document
#                      memory (scripts/bench_train_step.py --pick largest-memory)
#   summary.txt        target tokens/s of both over all logged intervals, the ratio
# TOKENS=600000: instead of N updates each, each model trains on that many target
# tokens (recipes/tvsub_zh_en/budget.py, as the study's stage 2 does: 600,000 is the
# study's DOC_TOKENS), so the rates are over the study's whole stage 2.
# The shape and batch size are the study's (DIM=192 FFN=768 MAX_TOKENS=2048);
# DIM=256 FFN=1024 MAX_TOKENS=4096 gives the shape of the first study
# (2026-11-26); LENGTH_BUCKETS=1 selective's batches as one length group
# (the default before --length-buckets). Run it alone: two torch jobs on 2 cores slow each other.
set -euo pipefail
DATA=${1:?usage: $0 DATA_BIN OUT_DIR}
OUT=${2:?usage: $0 DATA_BIN OUT_DIR}
N=${N:-30}
THREADS=${THREADS:-1}
PY=${PYTHON:-python}
mkdir -p "$OUT"
DIM=${DIM:-192}
FFN=${FFN:-768}
MAX_TOKENS=${MAX_TOKENS:-2048}
LENGTH_BUCKETS=${LENGTH_BUCKETS:-4}  # the recipe's; 1: the batch as one group
SHAPE=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim "$DIM" --decoder-embed-dim "$DIM"
       --encoder-ffn-embed-dim "$FFN" --decoder-ffn-embed-dim "$FFN"
       --encoder-attention-heads 4 --decoder-attention-heads 4)
TRAIN=(--user-dir ctx_fairseq --log-format simple --data-buffer-size 0 "${SHAPE[@]}"
       --dropout 0.2 --attention-dropout 0.1 --activation-dropout 0.1 --optimizer adam
       --adam-betas "(0.9, 0.98)" --clip-norm 1.0 --label-smoothing 0.1 --seed 1 --num-workers 0
       --max-tokens "$MAX_TOKENS" --lr 5e-4 --lr-scheduler fixed --task document_translation
       --criterion label_smoothed_cross_entropy_ctx --coword-dropout 0.1)
SELECTIVE=(--arch transformer_selective_doc --document-context online --document-memory
           --memory-precomputed --length-buckets "$LENGTH_BUCKETS" --doc-attention hierarchical --sentence-attn sparsemax
           --word-attn softmax --context-memory frozen
           --init-from-sentence-checkpoint "$OUT/stage1/checkpoint_last.pt")
export OMP_NUM_THREADS=$THREADS
if [ ! -f "$OUT/stage1/checkpoint_last.pt" ]; then
    fairseq-train "$DATA" --user-dir ctx_fairseq --save-dir "$OUT/stage1" --arch transformer \
        "${SHAPE[@]}" --optimizer adam --lr 1e-4 --max-tokens "$MAX_TOKENS" --max-update 2 \
        --num-workers 0 --criterion label_smoothed_cross_entropy --no-epoch-checkpoints \
        --disable-validation > "$OUT/stage1.log" 2>&1
fi
TRANSFORMER=(--arch transformer --source-context-size 0)
N_SELECTIVE=$N
N_TRANSFORMER=$N
if [ -n "${TOKENS:-}" ]; then  # the study's stage 2: an equal target-token budget
    N_SELECTIVE=$("$PY" recipes/tvsub_zh_en/budget.py "$TOKENS" "$OUT/budget-selective.json" -- \
        "$DATA" "${TRAIN[@]}" --save-dir "$OUT/selective" "${SELECTIVE[@]}" 2> "$OUT/budget.log" | tail -n 1)
    N_TRANSFORMER=$("$PY" recipes/tvsub_zh_en/budget.py "$TOKENS" "$OUT/budget-transformer.json" -- \
        "$DATA" "${TRAIN[@]}" --save-dir "$OUT/transformer" "${TRANSFORMER[@]}" 2>> "$OUT/budget.log" | tail -n 1)
fi
common=("${TRAIN[@]}" --log-interval 10 --disable-validation --no-save)
fairseq-train "$DATA" "${common[@]}" --max-update "$N_SELECTIVE" --save-dir "$OUT/selective" \
    "${SELECTIVE[@]}" > "$OUT/selective.log" 2>&1
cp "$OUT/stage1/checkpoint_last.pt" "$OUT/transformer-init.pt"
fairseq-train "$DATA" "${common[@]}" --max-update "$N_TRANSFORMER" --save-dir "$OUT/transformer" \
    "${TRANSFORMER[@]}" --restore-file "$OUT/transformer-init.pt" --reset-optimizer \
    --reset-dataloader --reset-meters --reset-lr-scheduler > "$OUT/transformer.log" 2>&1
"$PY" scripts/bench_train_step.py "$DATA" "${TRAIN[@]}" --save-dir "$OUT/episode" \
    "${SELECTIVE[@]}" -- --pick largest-memory --steps 2 --json "$OUT/episode.json" \
    > "$OUT/episode.log" 2>&1
"$PY" - "$OUT" <<'EOF'
import json, re, sys
out = sys.argv[1]
def rate(name):
    toks = secs = 0.0
    for line in open(f"{out}/{name}.log"):
        if "train_inner" in line:
            f = dict(re.findall(r"(\w+)=([0-9.e+-]+)", line))
            toks += float(f["wpb"]) * 10
            secs += float(f["wpb"]) * 10 / float(f["wps"])
    return toks / secs if secs else float("nan")
def updates(name):
    n = 0
    for line in open(f"{out}/{name}.log"):
        if "train_inner" in line:
            n = int(dict(re.findall(r"(\w+)=([0-9.e+-]+)", line))["num_updates"])
    return n
sel, tr = rate("selective"), rate("transformer")
ep = json.load(open(f"{out}/episode.json"))
text = (f"selective {sel:.1f} target tokens/s, transformer {tr:.1f}: {sel / tr:.2f}x "
        f"({updates('selective')} and {updates('transformer')} updates)\n"
        f"largest-memory batch: {ep['sentences']} sentences, {ep['visible_memory_sentences_max']} "
        f"memory sentences visible, {ep['step_s']} s per update, peak RSS {ep['peak_rss_mb']} MB\n")
open(f"{out}/summary.txt", "w").write(text)
print(text, end="")
EOF
