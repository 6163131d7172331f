#!/usr/bin/env bash
# The dropped-pronoun study (issue 38): the CPU study's shape (run.sh --study)
# for the transformer, transformer_context_aware and transformer_selective_doc,
# one run per seed (SEEDS, default 1 2 3: stage 1 included, so the spread
# across seeds is the whole training's), each in WORKDIR/seed-N (resumable:
# kill it and run it again; finished steps are skipped). Without a test set
# in the input, dev's first episode chooses the checkpoints and its second is
# reported (prep: EVAL_SPLIT=dev-episodes). Then dp_report.py reads every
# seed's run: WORKDIR/results-dp.{md,json} (means over seeds, intervals of a
# bootstrap over seeds and sentences, paired comparisons with the
# transformer). --gpu: run.sh's GPU mode instead of --study (the full corpus,
# Transformer base; README.md, 'The dropped-pronoun study').
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: recipes/tvsub_zh_en/dp_study.sh --raw DIR [--workdir DIR] [--gpu] [--report-only]

  --raw DIR      the TVsub clone or extracted archive (run.sh --raw)
  --workdir DIR  one run.sh work directory per seed: DIR/seed-N (--study: its
                 DIR/seed-N/study), and the report DIR/results-dp.{md,json}  [work/tvsub_dp]
  --gpu          run.sh's GPU mode (no --study): the full corpus, Transformer
                 base, with SAMPLE_CONTEXT=1, COWORD_DROPOUT=0.1 and
                 MEMORY_WINDOW=10 unless set (the study's context training)
  --report-only  no training: dp_report.py on the runs there are
Environment: SEEDS (1 2 3), MODELS (transformer context_aware selective); the
others as run.sh's (README.md); PYTHON (python) runs dp_report.py."
RAW=""
WORKDIR=work/tvsub_dp
GPU=0
REPORT_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
        --raw) RAW=${2:?--raw DIR}; shift 2 ;;
        --workdir) WORKDIR=${2:?--workdir DIR}; shift 2 ;;
        --gpu) GPU=1; shift ;;
        --report-only) REPORT_ONLY=1; shift ;;
        -h|--help) printf '%s\n' "$usage"; exit 0 ;;
        *) printf '%s\nerror: unknown argument %s\n' "$usage" "$1" >&2; exit 1 ;;
    esac
done
[ -n "$RAW" ] || [ "$REPORT_ONLY" = 1 ] || { printf '%s\nerror: --raw DIR is required\n' "$usage" >&2; exit 1; }
SEEDS=${SEEDS:-1 2 3}
export MODELS=${MODELS-transformer context_aware selective}
for s in $SEEDS; do
    [[ "$s" =~ ^[0-9]+$ ]] || { printf 'error: SEEDS: %s is not a number\n' "$s" >&2; exit 1; }
done
if [ "$REPORT_ONLY" = 0 ]; then
    for s in $SEEDS; do
        if [ "$GPU" = 1 ]; then
            SEED=$s SAMPLE_CONTEXT=${SAMPLE_CONTEXT-1} COWORD_DROPOUT=${COWORD_DROPOUT-0.1} \
                MEMORY_WINDOW=${MEMORY_WINDOW-10} bash "$HERE/run.sh" --raw "$RAW" \
                --workdir "$WORKDIR/seed-$s"
        else
            SEED=$s bash "$HERE/run.sh" --study --raw "$RAW" --workdir "$WORKDIR/seed-$s"
        fi
    done
fi
# shellcheck disable=SC2086  # MODELS: a word list
"${PYTHON:-python}" "$HERE/dp_report.py" --workdir "$WORKDIR" --models sentence $MODELS
