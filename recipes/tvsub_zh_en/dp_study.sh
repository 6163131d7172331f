#!/usr/bin/env bash
# The dropped-pronoun study (issue 38): the CPU study's shape (run.sh --study)
# for the transformer, transformer_context_aware and transformer_selective_doc,
# one run per seed (SEEDS, default 1 2 3: stage 1 included, so the spread
# across seeds is the whole training's), each in WORKDIR/seed-N (resumable:
# kill it and run it again; finished steps are skipped). Without a test set
# in the input, dev's first episode chooses the checkpoints and its second is
# reported (prep: EVAL_SPLIT=dev-episodes).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: recipes/tvsub_zh_en/dp_study.sh --raw DIR [--workdir DIR]

  --raw DIR      the TVsub clone or extracted archive (run.sh --raw)
  --workdir DIR  one run.sh --study work directory per seed: DIR/seed-N  [work/tvsub_dp]
Environment: SEEDS (1 2 3), MODELS (transformer context_aware selective); the
others as run.sh's (README.md)."
RAW=""
WORKDIR=work/tvsub_dp
while [ $# -gt 0 ]; do
    case $1 in
        --raw) RAW=${2:?--raw DIR}; shift 2 ;;
        --workdir) WORKDIR=${2:?--workdir DIR}; shift 2 ;;
        -h|--help) printf '%s\n' "$usage"; exit 0 ;;
        *) printf '%s\nerror: unknown argument %s\n' "$usage" "$1" >&2; exit 1 ;;
    esac
done
[ -n "$RAW" ] || { printf '%s\nerror: --raw DIR is required\n' "$usage" >&2; exit 1; }
SEEDS=${SEEDS:-1 2 3}
export MODELS=${MODELS-transformer context_aware selective}
for s in $SEEDS; do
    [[ "$s" =~ ^[0-9]+$ ]] || { printf 'error: SEEDS: %s is not a number\n' "$s" >&2; exit 1; }
    SEED=$s bash "$HERE/run.sh" --study --raw "$RAW" --workdir "$WORKDIR/seed-$s"
done
