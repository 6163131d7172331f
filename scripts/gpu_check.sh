#!/usr/bin/env bash
# The GPU check (issues 18, 24, 27) on a lent GPU machine (README, "Running on a GPU").
# From the project root on this machine: bash ../shared/gpu/prepare.sh (wheels into .gpu/);
# then, on the GPU machine, in a copy of the working tree that includes .gpu/, in two calls
# (a session has 15 minutes of device time in all, the machine's start included):
#   GPU_CHECK_PHASES="1 2" GPU_CHECK_BUDGET=250 bash .gpu/on-gpu.sh bash scripts/gpu_check.sh
#   GPU_CHECK_PHASES="4 3" GPU_CHECK_BUDGET=430 bash .gpu/on-gpu.sh bash scripts/gpu_check.sh
# (the sweep first in call 2: phase 3's caps add up to more than what is left; each call
# with carry [".gpu"], the second right after the first: the machine goes back 30 s
# after a call)
# (a start of more than 2 minutes leaves too little for both: run phase 4 in another session)
# Phases (each under its own cap; all under one deadline, GPU_CHECK_BUDGET seconds):
#   1  the CUDA tests: pytest -m cuda -n 8 (cap 120 s)
#   2  the default suite with CUDA present, the cuda-marked tests excluded (phase 1 ran
#      them): pytest -n 14, the recipes' smoke tests first, JUnit XML (cap 180 s; SIGINT, so that pytest still writes its
#      summary and the XML); the logs of the recipes' steps (every */logs/*.log under
#      pytest's temporary directories) are kept: phase2_recipe_logs/ in gpu_check.tgz
#   3  ctx-bench --device cuda, base shape, 3 repeats, beam 5 over 16 sentences, fp32 and
#      fp16: the transformer against itself and the 7 architectures of issue 27's table
#      (--doc-len 2: context sentences per sentence); concatenation on its own run at
#      --doc-len 10 (documents of 10 sentences: its measured batch needs sentences with
#      their whole context); transformer_selective_doc (fp16) with 100-sentence documents
#      and 1,000-sentence documents in 40,000-token batches (the batch holding the last
#      sentence, issue 24). Achieved TFLOP/s and MFU in every row.
#   4  the --max-tokens sweep (fp16; 4,096, 16,384, 32,768 tokens) of fairseq-train's own step
#      (--train-step fairseq: fairseq's Trainer, --fp16's half model and FP16Optimizer): the
#      transformer and Dec-DC, their MFU at each batch and where each stops being host-bound
#   5  (not in the default phases) phase 3's fp16 table with --train-step fairseq: what
#      fairseq-train --fp16 runs, beside phase 3's autocast step (fairseq-train --amp)
#   6  (not in the default phases; one call of at most 9 minutes: GPU_CHECK_PHASES=6
#      GPU_CHECK_BUDGET=530) the selective model's accelerator path (issue 36): the paper's
#      model (frozen memory, --memory-precomputed) against the transformer on documents of
#      100 and 1,000 sentences of 20 tokens, --max-tokens 4096, the batch holding the last
#      sentence, fp32 and fp16: tokens/s, peak memory and host syncs per training step
#      (train_syncs_per_step), gathered into one file, selective_accelerator.json
# A bench step gets what is left of the budget (at most its own cap) and is skipped, with a
# note, under 20 s.
# Every ctx-bench step has ONE argument list, shared by the real and the dry run; only the
# shapes differ (model dimensions, lengths, --max-tokens, --doc-len of whole-document
# models, repeats: REAL_SHAPE / DRY_SHAPE and each step's own shape). The real run:
#   ctx-bench --device cuda ARGS REAL-SHAPES
# GPU_CHECK_DRY=1, a dry run on a CPU-only machine (tests/test_gpu_check.py), runs for each
# step (a) the real command itself with --dry-run added: every argument checked and every
# model and measured batch built at the real shapes, on the CPU, nothing timed (the
# concatenation error of issue 27 shows here); (b) where the step is fp32, the same ARGS
# measured on the CPU with the dry shapes (the whole pipeline, tiny). Phase 2 of a dry run
# runs a small part of the suite (PHASE2_TESTS); no -n without pytest-xdist.
# Results: $OUT/summary.txt (versions, GPU, each phase's commands, status and tail, the bench
# tables) and $OUT/gpu_check.tgz (every phase's full output: phase1_cuda.txt,
# phase2_suite.txt, phase2_junit.xml, phase2_recipe_logs/, bench_*.json, bench_*.log), re-made
# after every phase so that a run cut short still returns what it did.
# Environment: GPU_CHECK_PHASES (default "1 2 3 4"), GPU_CHECK_BUDGET (seconds, default
# 530), the caps PHASE1_CAP, PHASE2_CAP, BENCH_CAP (each main precision), CONCAT_CAP,
# SEL_CAP (selective, 100-sentence documents), SEL1000_CAP, SWEEP_CAP, pytest-xdist workers PHASE1_N, PHASE2_N.
set -u
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-530}
PHASES=${GPU_CHECK_PHASES:-1 2 3 4}
DRY=${GPU_CHECK_DRY:-0}
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUMMARY=$WORK/summary.txt
mkdir -p "$OUT"

left() { echo $((START + BUDGET - $(date +%s))); }
note() { echo "$*" | tee -a "$SUMMARY"; }
pack() {  # everything so far into $OUT (2 files)
    cp "$SUMMARY" "$OUT/summary.txt"
    tar -C "$WORK" -czf "$OUT/gpu_check.tgz" . 2>/dev/null || true
}
# timeout_for CAP: CAP seconds, or what is left of the budget if less
timeout_for() {
    local l; l=$(left)
    if [ "$1" -lt "$l" ]; then echo "$1"; else echo "$l"; fi
}
# run_phase NAME CAP OUTFILE COMMAND...: runs under timeout -s INT (then KILL 20 s later);
# standard output and error into OUTFILE, or standard error into $ERRFILE where it is set
run_phase() {
    local name=$1 cap=$2 out=$3 t rc t0
    shift 3
    t=$(timeout_for "$cap")
    if [ "$t" -lt 20 ]; then
        note "== $name: SKIPPED (only $(left) s of the ${BUDGET} s budget left)"
        return 0
    fi
    note "== $name: $* (timeout ${t} s)"
    t0=$(date +%s)
    if [ -n "${ERRFILE:-}" ]; then
        timeout -s INT -k 20 "$t" "$@" > "$out" 2>> "$ERRFILE"
    else
        timeout -s INT -k 20 "$t" "$@" > "$out" 2>&1
    fi
    rc=$?
    note "   rc=$rc after $(($(date +%s) - t0)) s$([ $rc -eq 124 ] && echo ' (TIMED OUT)')"
    grep -v -E 'USDT:|Warning|deprecation|hydra|See https|^ *$' "${ERRFILE:-$out}" \
        | tail -n 15 | sed 's/^/   | /' >> "$SUMMARY"
    pack
    return 0
}

{
    echo "gpu_check.sh $(date -u +%FT%TZ) dry=$DRY phases='$PHASES' budget=${BUDGET}s"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed paths"
    "$PY" - <<'EOF' 2>&1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu:", torch.cuda.get_device_name(0), f"{p.total_memory / 2**30:.0f} GiB")
else:
    print("gpu: none")
try:
    import fairseq
    print("fairseq", fairseq.__version__)
except Exception as e:
    print("fairseq: not importable:", e)
EOF
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
    echo "cores: $(nproc --all 2>/dev/null || nproc)"
} > "$SUMMARY" 2>&1
cat "$SUMMARY"
pack

# a module that fails to import (e.g. mid-edit) must not stop the others; xunit1: the JUnit XML
# keeps the tests' record_property values (tests/test_host_reads.py's counts)
PYTEST_OPTS=(-q -p no:cacheprovider --continue-on-collection-errors -o junit_family=xunit1
             --disable-warnings)
failures() {  # the failing tests' lines of a pytest output into the summary
    grep -E '^(FAILED|ERROR|XPASS)' "$1" | head -n 60 | sed 's/^/   ! /' >> "$SUMMARY"
    pack
}
XDIST=()
if "$PY" -c "import xdist" 2> /dev/null; then XDIST=(-n); fi
pytest_n() {  # -n N where pytest-xdist is installed
    if [ ${#XDIST[@]} -gt 0 ]; then echo "-n $1"; fi
}
# keep_recipe_logs TMPBASE DEST: the recipes' step logs (*/logs/*.log, at most 2 MB each) under
# pytest's temporary directories into DEST, their paths kept; the failing steps' tails are in
# the tests' messages (recipes/lib/recipe.sh prints them)
keep_recipe_logs() {
    local f n=0
    [ -d "$1" ] || return 0
    while IFS= read -r -d '' f; do
        mkdir -p "$2/$(dirname "${f#"$1"/}")" && cp "$f" "$2/${f#"$1"/}" && n=$((n + 1))
    done < <(find "$1" -path '*/logs/*' -name '*.log' -size -2M -print0 2> /dev/null)
    note "   kept $n recipe step log(s) in phase2_recipe_logs/"
}

# ---------------------------------------------------------------- ctx-bench steps
# Shapes: the real run's (ctx-bench's defaults are the base shape) and the dry run's (tiny).
REAL_SHAPE=(--repeats 3)
DRY_SHAPE=(--layers 2 --embed-dim 32 --heads 2 --ffn-dim 64 --vocab 64 --src-len 6 --tgt-len 6
           --max-tokens 192 --repeats 1 --train-steps 1 --beam 2 --threads 1)
# bench NAME CAP 'REAL STEP SHAPE | DRY STEP SHAPE' ARGS...: one ctx-bench step; ARGS are the
# same in the real and the dry run. JSON into bench_NAME.json, log into bench_NAME.log
# (dry run (a): bench_NAME_dry.*), the Markdown table into the summary.
bench() {
    local name=$1 cap=$2 real_step dry_step
    IFS='|' read -r real_step dry_step <<< "$3"
    shift 3
    local args=("$@") real_s dry_s
    read -r -a real_s <<< "$real_step"
    read -r -a dry_s <<< "$dry_step"
    local real=("$PY" -m ctx_fairseq.cli.bench --device cuda --json "${args[@]}"
                "${REAL_SHAPE[@]}" "${real_s[@]}")
    if [ "$DRY" = 1 ]; then
        # (a) the real command, --dry-run added: the arguments and batches at the real shapes
        ERRFILE=$WORK/bench_${name}_dry.log run_phase "phase $phase: ctx-bench $name (dry run of the real command)" \
            "$cap" "$WORK/bench_${name}_dry.json" "${real[@]}" --dry-run
        # (b) the same ARGS measured on the CPU at the dry shapes (no fp16 on the CPU)
        local a fp16=0
        for a in "${args[@]}"; do [ "$a" = --fp16 ] && fp16=1; done
        if [ $fp16 = 1 ]; then
            note "   (b) not measured on the CPU: --fp16 needs CUDA (the dry run (a) checked it)"
            return 0
        fi
        ERRFILE=$WORK/bench_$name.log run_phase "phase $phase: ctx-bench $name (the same ARGS, dry shapes, CPU)" \
            "$cap" "$WORK/bench_$name.json" "$PY" -m ctx_fairseq.cli.bench --device cpu --json \
            "${args[@]}" "${DRY_SHAPE[@]}" "${dry_s[@]}"
    else
        ERRFILE=$WORK/bench_$name.log run_phase "phase $phase: ctx-bench $name" "$cap" \
            "$WORK/bench_$name.json" "${real[@]}"
    fi
    if [ -s "$WORK/bench_$name.json" ]; then
        "$PY" -m ctx_fairseq.cli.bench --from-json "$WORK/bench_$name.json" --markdown \
            >> "$SUMMARY" 2>> "$WORK/bench_$name.log"
        pack
    fi
}
MAIN=transformer,transformer_context_aware,transformer_dc,transformer_dc_dec,transformer_dc_full,transformer_hybrid,transformer_doc_zhang2018,transformer_han

for phase in $PHASES; do
case $phase in
1)
    # shellcheck disable=SC2046
    run_phase "phase 1: CUDA tests" "${PHASE1_CAP:-120}" "$WORK/phase1_cuda.txt" \
        env OMP_NUM_THREADS=1 "$PY" -m pytest -m cuda $(pytest_n "${PHASE1_N:-8}") "${PYTEST_OPTS[@]}" \
        --junitxml="$WORK/phase1_junit.xml"
    [ -f "$WORK/phase1_cuda.txt" ] && failures "$WORK/phase1_cuda.txt"
    ;;
2)
    if [ "$DRY" = 1 ]; then
        read -r -a SUITE <<< "${PHASE2_TESTS:-tests/test_host_reads.py -k transformer_hybrid}"
    else
        # every test file, the recipes' smoke tests first (the longest; pytest-xdist hands the
        # tests out in the order of the files named), so that a cut-short phase has run them
        FIRST=(tests/test_recipe_tvsub.py tests/test_recipes_sentence.py tests/test_recipes_context.py
               tests/test_recipe_gpu_branch.py)
        SUITE=(-m "not slow and not cuda" "${FIRST[@]}")
        for f in tests/test_*.py; do
            case " ${FIRST[*]} " in *" $f "*) ;; *) SUITE+=("$f") ;; esac
        done
    fi
    # pytest's temporary directories in $WORK: the recipes' step logs survive a failure
    TMPBASE=$(mktemp -d /tmp/gpu_check_pytest.XXXXXX)
    # shellcheck disable=SC2046
    run_phase "phase 2: default suite" "${PHASE2_CAP:-180}" "$WORK/phase2_suite.txt" \
        env OMP_NUM_THREADS=1 "$PY" -m pytest $(pytest_n "${PHASE2_N:-14}") "${PYTEST_OPTS[@]}" \
        --basetemp="$TMPBASE" --junitxml="$WORK/phase2_junit.xml" "${SUITE[@]}"
    [ -f "$WORK/phase2_suite.txt" ] && failures "$WORK/phase2_suite.txt"
    keep_recipe_logs "$TMPBASE" "$WORK/phase2_recipe_logs"
    rm -rf "$TMPBASE"
    pack
    ;;
3)
    bench fp32 "${BENCH_CAP:-110}" '|' --archs "$MAIN" --doc-len 2 --infer-sentences 16
    bench fp16 "${BENCH_CAP:-110}" '|' --archs "$MAIN" --doc-len 2 --infer-sentences 16 --fp16
    bench concat_fp32 "${CONCAT_CAP:-45}" '|' --archs transformer_concat --doc-len 10 \
        --infer-sentences 16
    bench concat_fp16 "${CONCAT_CAP:-45}" '|' --archs transformer_concat --doc-len 10 \
        --infer-sentences 16 --fp16
    bench selective100 "${SEL_CAP:-75}" '--doc-len 100 | --doc-len 10' \
        --archs transformer_selective_doc --fp16 --infer-sentences 100
    bench selective1000 "${SEL1000_CAP:-100}" '--max-tokens 40000 --doc-len 1000 | --max-tokens 600 --doc-len 50' \
        --archs transformer_selective_doc --fp16 --doc-batch last --infer-sentences 0
    ;;
4)
    bench sweep_fp16 "${SWEEP_CAP:-150}" '--sweep-max-tokens 4096,16384,32768 --repeats 2 | --sweep-max-tokens 96,192' \
        --archs transformer_dc_dec --doc-len 2 --infer-sentences 0 --fp16 --train-step fairseq
    ;;
5)
    bench fp16_fairseq "${BENCH_CAP:-110}" '|' --archs "$MAIN" --doc-len 2 --infer-sentences 16 \
        --fp16 --train-step fairseq
    ;;
6)
    SELACC=(--archs "transformer_selective_doc[--memory-precomputed]" --src-len 20 --tgt-len 20
            --doc-batch last --infer-sentences 0)
    bench selacc100_fp32 "${SELACC_CAP:-120}" '--doc-len 100 --repeats 2 | --doc-len 10' "${SELACC[@]}"
    bench selacc100_fp16 "${SELACC_CAP:-120}" '--doc-len 100 --repeats 2 | --doc-len 10' "${SELACC[@]}" --fp16
    bench selacc1000_fp32 "${SELACC_CAP:-120}" '--doc-len 1000 --repeats 2 | --doc-len 50' "${SELACC[@]}"
    bench selacc1000_fp16 "${SELACC_CAP:-120}" '--doc-len 1000 --repeats 2 | --doc-len 50' "${SELACC[@]}" --fp16
    "$PY" - "$WORK" > "$WORK/selective_accelerator.json" <<'PYEOF'
import glob, json, os, sys
out = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench_selacc*.json"))):
    name = os.path.basename(path)[len("bench_"):-len(".json")]
    try:
        out[name] = json.load(open(path))
    except ValueError as err:
        out[name] = {"error": str(err)}
json.dump(out, sys.stdout, indent=1)
PYEOF
    note "   selective_accelerator.json: $(grep -c '"arch"' "$WORK/selective_accelerator.json") row(s)"
    pack
    ;;
*)
    note "unknown phase '$phase' (GPU_CHECK_PHASES: 1 2 3 4 5 6)"
    ;;
esac
done
note "== done in $(($(date +%s) - START)) s; results in $OUT (summary.txt, gpu_check.tgz)"
pack
rm -rf "$WORK"
