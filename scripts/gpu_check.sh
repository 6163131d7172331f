#!/usr/bin/env bash
# The GPU check of issue 18, in one run on a lent GPU machine (README, "Running on a GPU").
# From the project root on this machine: bash ../shared/gpu/prepare.sh (wheels into .gpu/);
# then, on the GPU machine, in a copy of the working tree that includes .gpu/:
#   bash .gpu/on-gpu.sh bash scripts/gpu_check.sh
# Phases (each under its own timeout; all under one deadline, GPU_CHECK_BUDGET seconds,
# default 530: the whole script stays under 9 minutes):
#   1  the CUDA tests: pytest -m cuda -n 8 (timeout 200 s)
#   2  the default suite with CUDA present (defect 3), the cuda-marked tests excluded (phase 1
#      ran them): pytest -n 14, JUnit XML (timeout 240 s; SIGINT, so that pytest still writes
#      its summary and the XML)
#   3  ctx-bench --device cuda, base shape, 3 repeats, beam 5 over 16 sentences: the
#      transformer against itself and the 7 architectures of the issue's table, fp32 then fp16;
#      transformer_selective_doc (fp16) with 100-sentence documents (whole-document beam) and
#      1,000-sentence documents in 40,000-token batches (the batch holding the last sentence)
#      A bench step gets what is left of the budget (at most its own cap) and is skipped, with a
#      note, under 20 s.
# Results: $OUT/summary.txt (versions, GPU, each phase's status and tail, the bench tables) and
# $OUT/gpu_check.tgz (every phase's full output: phase1_cuda.txt, phase2_suite.txt,
# phase2_junit.xml, bench_*.json, bench.log), re-made after every phase so that a run cut short
# still returns what it did.
# Environment: GPU_CHECK_PHASES (default "1 2 3"), GPU_CHECK_BUDGET (seconds), the phases'
# caps PHASE1_CAP, PHASE2_CAP, BENCH_CAP (each precision), SEL_CAP (each selective run) and
# pytest-xdist workers PHASE1_N, PHASE2_N (e.g. to run phases 1 and 2 side by side),
# GPU_CHECK_DRY=1: a dry run on a CPU-only machine (tiny bench shapes on the CPU, fp32 only;
# phase 2 a small part of the suite, PHASE2_TESTS; no -n without pytest-xdist).
set -u
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-530}
PHASES=${GPU_CHECK_PHASES:-1 2 3}
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

for phase in $PHASES; do
case $phase in
1)
    # shellcheck disable=SC2046
    run_phase "phase 1: CUDA tests" "${PHASE1_CAP:-200}" "$WORK/phase1_cuda.txt" \
        env OMP_NUM_THREADS=1 "$PY" -m pytest -m cuda $(pytest_n "${PHASE1_N:-8}") "${PYTEST_OPTS[@]}" \
        --junitxml="$WORK/phase1_junit.xml"
    [ -f "$WORK/phase1_cuda.txt" ] && failures "$WORK/phase1_cuda.txt"
    ;;
2)
    if [ "$DRY" = 1 ]; then
        read -r -a SUITE <<< "${PHASE2_TESTS:-tests/test_host_reads.py -k transformer_hybrid}"
    else
        SUITE=(-m "not slow and not cuda")
    fi
    # shellcheck disable=SC2046
    run_phase "phase 2: default suite" "${PHASE2_CAP:-240}" "$WORK/phase2_suite.txt" \
        env OMP_NUM_THREADS=1 "$PY" -m pytest $(pytest_n "${PHASE2_N:-14}") "${PYTEST_OPTS[@]}" \
        --junitxml="$WORK/phase2_junit.xml" "${SUITE[@]}"
    [ -f "$WORK/phase2_suite.txt" ] && failures "$WORK/phase2_suite.txt"
    ;;
3)
    if [ "$DRY" = 1 ]; then
        DEV=(--device cpu --threads 1)
        SHAPE=(--layers 2 --embed-dim 32 --heads 2 --ffn-dim 64 --vocab 64 --src-len 6
               --tgt-len 6 --max-tokens 192 --repeats 1 --train-steps 1 --beam 2)
        FP16=()
        SEL100=(--doc-len 10 --infer-sentences 100)
        SEL1000=(--max-tokens 600 --doc-batch last --doc-len 50 --infer-sentences 0)
        INFER=(--infer-sentences 4)
    else
        DEV=(--device cuda)
        SHAPE=(--repeats 3)
        FP16=(--fp16)
        SEL100=(--doc-len 100 --infer-sentences 100)
        SEL1000=(--max-tokens 40000 --doc-batch last --doc-len 1000 --infer-sentences 0)
        INFER=(--infer-sentences 16)
    fi
    MAIN=transformer,transformer_concat,transformer_context_aware,transformer_dc,transformer_dc_dec,transformer_dc_full,transformer_hybrid,transformer_doc_zhang2018,transformer_han
    bench() {  # bench NAME CAP ARGS...: ctx-bench --json into bench_NAME.json, log into bench.log
        local name=$1 cap=$2
        shift 2
        echo "== ctx-bench $name" >> "$WORK/bench.log"
        ERRFILE=$WORK/bench.log run_phase "phase 3: ctx-bench $name" "$cap" \
            "$WORK/bench_$name.json" "$PY" -m ctx_fairseq.cli.bench "${DEV[@]}" --json "$@"
        if [ -s "$WORK/bench_$name.json" ]; then
            "$PY" -m ctx_fairseq.cli.bench --from-json "$WORK/bench_$name.json" --markdown \
                >> "$SUMMARY" 2>> "$WORK/bench.log"
            pack
        fi
    }
    bench fp32 "${BENCH_CAP:-150}" --archs "$MAIN" --doc-len 2 "${SHAPE[@]}" "${INFER[@]}"
    bench fp16 "${BENCH_CAP:-150}" --archs "$MAIN" --doc-len 2 "${SHAPE[@]}" "${INFER[@]}" "${FP16[@]}"
    bench selective100 "${SEL_CAP:-90}" --archs transformer_selective_doc "${SHAPE[@]}" "${FP16[@]}" \
        "${SEL100[@]}"
    bench selective1000 "${SEL_CAP:-120}" --archs transformer_selective_doc "${SHAPE[@]}" "${FP16[@]}" \
        "${SEL1000[@]}"
    ;;
*)
    note "unknown phase '$phase' (GPU_CHECK_PHASES: 1 2 3)"
    ;;
esac
done
note "== done in $(($(date +%s) - START)) s; results in $OUT (summary.txt, gpu_check.tgz)"
pack
rm -rf "$WORK"
