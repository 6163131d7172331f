# shellcheck shell=bash
# Shared steps of the ctx-fairseq dataset recipes (recipes/<dataset>/run.sh).
#
# A recipe sets RECIPE_NAME and RECIPE_USAGE, sources this file, calls
# `recipe_init "$@"`, and runs its steps with `step NAME FUNCTION [ARGS...]`.
#
# Conventions every recipe follows:
#   * `set -euo pipefail`; each step runs in a subshell with `set -e` on, so a
#     failing command stops the step (bash ignores `set -e` inside a function
#     called as `f || ...`: steps are therefore never called that way).
#   * Idempotent: a finished step leaves $WORK/.done/NAME and is skipped when
#     the recipe is run again with the same settings; a failed step leaves no
#     marker and is re-run. To redo a step, remove its marker, every later
#     marker and the checkpoint directories of the training steps among them
#     (or use another --workdir): the steps after it read its outputs, and a
#     finished training run is never trained further (see train below).
#   * A marker records what its step was run with (key=value lines, then their
#     sha256): the step's function and arguments (arg.0, arg.1, ...; paths under
#     the work directory written as $WORK/...), SMOKE, every variable named in
#     the recipe's RECIPE_SETTINGS array (see below), and the global settings
#     the step READ (the line reads=...; see step_reads): TRAIN_EXTRA in steps
#     that train (train()), GEN_EXTRA in steps that generate (generate(), and
#     the functions of steps_*.sh listed in STEP_FUNC_READS), RAW (the --raw
#     directory, resolved; $WORK/raw without --raw) in the data steps (those
#     reading raw files through raw_file / sent_find, and the steps named in
#     RECIPE_RAW_STEPS: download prep text). So a new GEN_EXTRA stops a re-run
#     at the first finished step that generated, not at the data steps. A
#     re-run with other settings stops at the first finished step whose record
#     differs, naming what differs: its outputs, and every later step's, were
#     made with the old settings. A marker without a record (older recipes)
#     stops too. A moved work directory keeps its markers valid.
#   * Nothing half-written: files are written to NAME.part and renamed when
#     complete (`atomic`, `fetch`); a failed download leaves nothing behind.
#   * `--smoke`: the local steps (everything after the download) on a small
#     sample (`--raw DIR` or the recipe's own sample), a tiny model and a few
#     updates, to check a set-up in minutes on a CPU.
#
# Options every recipe takes (recipe_init):
#   --workdir DIR   where everything goes            [work/$RECIPE_NAME]
#   --smoke         local steps on a small sample, tiny model
#   --raw DIR       take the downloaded/extracted files from DIR instead of
#                   downloading (what the download step would have written)
#   --cpu           train and translate on the CPU
#   -h, --help
# Environment: PYTHON (python), TRAIN_EXTRA / GEN_EXTRA (extra fairseq options:
# fairseq-train's in every training step, fairseq-generate's in every decoding).
#
# Devices: `cuda_args` sets the array CUDA_ARGS to (--cuda) where the tools
# should use the GPU (no --cpu, and torch sees CUDA), else (); for the
# evaluation tools that take --cuda (fairseq itself uses the GPU unless --cpu).

RECIPE_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$RECIPE_LIB_DIR/../.." && pwd)
USER_DIR="$REPO/ctx_fairseq"
PY=${PYTHON:-python}

# the recipe's own settings for the step markers (see above); a recipe adds to it
if ! declare -p RECIPE_SETTINGS > /dev/null 2>&1; then RECIPE_SETTINGS=(); fi

log() { printf '[%s %s] %s\n' "${RECIPE_NAME:-recipe}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[%s] error: %s\n' "${RECIPE_NAME:-recipe}" "$*" >&2; exit 1; }

recipe_init() {
    : "${RECIPE_NAME:?a recipe sets RECIPE_NAME before recipe_init}"
    SMOKE=0
    RAW=""
    CPU=()
    WORK="work/$RECIPE_NAME"
    while [ $# -gt 0 ]; do
        case "$1" in
            --smoke) SMOKE=1 ;;
            --cpu) CPU=(--cpu) ;;
            --workdir) [ $# -ge 2 ] || die "--workdir needs a directory"; WORK=$2; shift ;;
            --workdir=*) WORK=${1#*=} ;;
            --raw) [ $# -ge 2 ] || die "--raw needs a directory"; RAW=$2; shift ;;
            --raw=*) RAW=${1#*=} ;;
            -h|--help) printf '%s\n' "${RECIPE_USAGE:-}"; exit 0 ;;
            *) die "unknown option $1 (see --help)" ;;
        esac
        shift
    done
    if [ -n "$RAW" ] && [ ! -d "$RAW" ]; then die "--raw $RAW: no such directory"; fi
    if [ "$SMOKE" = 1 ]; then
        WORK="$WORK/smoke"
        CPU=(--cpu)
    fi
    mkdir -p "$WORK/.done" "$WORK/logs"
    WORK=$(cd "$WORK" && pwd)
    # the raw directory as the step markers record it
    if [ -n "$RAW" ]; then STEP_RAW=$(cd "$RAW" && pwd -P); else STEP_RAW="$WORK/raw"; fi
    export PYTHONUNBUFFERED=1
    log "work directory $WORK$([ "$SMOKE" = 1 ] && echo ' (smoke mode)')"
}

# The global settings a step reads besides its arguments and RECIPE_SETTINGS
# are recorded in its marker only where it reads them (so that a new GEN_EXTRA
# does not stop the data and training steps). Two ways to know it:
#   * step_reads VAR...: called by the library function that reads VAR
#     (train: TRAIN_EXTRA, generate: GEN_EXTRA, raw_file / sent_find: RAW)
#     while a step runs; the marker lists the names (reads=...), and a re-run
#     compares the values of the names its marker lists. Any step calling
#     those functions, a recipe's own included, is covered.
#   * STEP_FUNC_READS[FUNCTION]: what a step function reads directly (not
#     through those functions), known before it runs; RECIPE_RAW_STEPS: the
#     names of the steps that read the raw directory themselves (a recipe's
#     `prep` reading ${RAW:-$WORK/raw}).
# Recording by the reading function rather than by step name keeps recipes and
# steps_*.sh correct without naming each of their steps.
declare -gA STEP_FUNC_READS=(
    [ctx_iterative_translate]=GEN_EXTRA [ctx_context_aware_analyses]=GEN_EXTRA
    [ctx_translate]=GEN_EXTRA [ctx_maruf_translate]=GEN_EXTRA
    [ctx_train_sentence]=TRAIN_EXTRA [ctx_train_document]=TRAIN_EXTRA
    [ctx_maruf_train]=TRAIN_EXTRA [sent_train]=TRAIN_EXTRA [sent_test]=GEN_EXTRA
    [sent_window_sweep]="TRAIN_EXTRA GEN_EXTRA" [sent_probe_files]=RAW
)
if ! declare -p RECIPE_RAW_STEPS > /dev/null 2>&1; then RECIPE_RAW_STEPS=(download prep text); fi
_STEP_READS_FILE=""

# step_reads VAR...: the running step reads the global VAR (TRAIN_EXTRA,
# GEN_EXTRA or RAW): its marker records VAR's value.
step_reads() {
    [ -n "$_STEP_READS_FILE" ] || return 0
    printf '%s\n' "$@" >> "$_STEP_READS_FILE" || die "cannot write $_STEP_READS_FILE"
}

# step NAME FUNCTION [ARGS...]: run FUNCTION unless NAME is done with the same
# settings (a done step with other settings: an error, see the top of this file).
step() {
    local name=$1 marker rc record sum reads old_reads v1 t0
    shift
    marker="$WORK/.done/$name"
    if [ -e "$marker" ]; then
        old_reads=$(sed -n 's/^reads=//p' "$marker")
        reads=$(_step_reads_of "$name" "$1" "$old_reads")
        record=$(_step_record "$reads" "$@") || exit 1
        sum=$(_step_sum "$record")
        if [ "$(sed -n 's/^sha256=//p' "$marker")" = "$sum" ]; then
            log "skip $name (done with these settings; to redo it remove $marker, every later marker and the checkpoint directories of the training steps among them, or use another --workdir)"
            return 0
        fi
        if ! grep -q '^reads=' "$marker" && grep -q '^TRAIN_EXTRA=' "$marker"; then
            # a marker of the earlier format (every global recorded in every step)
            v1=$(_step_record_v1 "$@") || exit 1
            if [ "$(sed -n 's/^sha256=//p' "$marker")" = "$(_step_sum "$v1")" ]; then
                log "skip $name (done with these settings, marker of an earlier format)"
                return 0
            fi
            record=$v1
        fi
        _step_mismatch "$name" "$marker" "$record"
    fi
    log "step $name"
    t0=$(date +%s)
    _STEP_READS_FILE="$marker.reads.part"
    : > "$_STEP_READS_FILE" || die "cannot write $_STEP_READS_FILE"
    set +e
    (set -e; "$@")
    rc=$?
    set -e
    reads=$(_step_reads_of "$name" "$1" "$(cat "$_STEP_READS_FILE")")
    rm -f "$_STEP_READS_FILE"
    _STEP_READS_FILE=""
    [ "$rc" -eq 0 ] || { _step_show_logs "$t0"; die "step $name failed (exit $rc); fix the cause and re-run: finished steps are skipped"; }
    record=$(_step_record "$reads" "$@") || exit 1
    sum=$(_step_sum "$record")
    # shellcheck disable=SC2016  # a literal $WORK
    if ! { printf '# step %s of %s: what it was run with (recipes/lib/recipe.sh); $WORK is the work directory\n' \
               "$name" "${RECIPE_NAME:-recipe}" && printf '%s\n' "$record" "sha256=$sum"; } > "$marker.part" \
        || ! mv "$marker.part" "$marker"; then
        rm -f "$marker.part"
        die "step $name: cannot write its marker $marker"
    fi
}

# _step_show_logs T0: the last lines of every log in $WORK/logs written since T0 (epoch
# seconds), on standard error: a failed step's reason (fairseq's output goes to its log and
# standard output, which a caller keeping standard error alone would not see).
_step_show_logs() {
    local f
    while IFS= read -r f; do
        printf '[%s] --- the last 30 lines of %s:\n' "${RECIPE_NAME:-recipe}" "$f" >&2
        tail -n 30 "$f" >&2
    done < <(find "$WORK/logs" -maxdepth 1 -type f -newermt "@$1" 2> /dev/null | sort)
}

_step_sum() {
    local sum
    sum=$(printf '%s\n' "$1" | sha256sum) || die "sha256sum failed"
    printf '%s' "${sum%% *}"
}

# _step_reads_of NAME FUNCTION NAMES: the globals step NAME reads (NAMES, as
# step_reads wrote them, with FUNCTION's STEP_FUNC_READS and RAW for the steps
# in RECIPE_RAW_STEPS), sorted, one space between them.
_step_reads_of() {
    local name=$1 fn=$2 extra="" s
    for s in "${RECIPE_RAW_STEPS[@]}"; do [ "$s" = "$name" ] && extra="RAW"; done
    # shellcheck disable=SC2086  # word lists
    printf '%s\n' $3 ${STEP_FUNC_READS[$fn]:-} $extra | LC_ALL=C sort -u | tr '\n' ' ' | sed 's/ $//'
}

# _step_value STRING: STRING for a marker line (the work directory as $WORK
# where it is a path's start: followed by '/' or the end, not preceded by a
# path character; backslashes and line breaks escaped, so a value is one line).
_step_value() {
    local v=$1 out="" pre rest
    if [ -n "${WORK:-}" ]; then
        while [[ $v == *"$WORK"* ]]; do
            pre=${v%%"$WORK"*}
            rest=${v#*"$WORK"}
            if { [ -z "$rest" ] || [ "${rest:0:1}" = / ]; } && [[ ! ${pre: -1} =~ [A-Za-z0-9._/~-] ]]; then
                # shellcheck disable=SC2016  # a literal $WORK
                out+="$pre"'$WORK'
            else
                out+="$pre$WORK"
            fi
            v=$rest
        done
    fi
    v=$out$v
    v=${v//\\/\\\\}
    v=${v//$'\n'/\\n}
    printf '%s' "$v"
}

# _step_record READS FUNCTION [ARGS...]: the key=value lines of a step's marker
# (READS: the globals it reads, see step_reads).
_step_record() {
    local reads=$1 i=0 a var decl seen=" SMOKE RAW TRAIN_EXTRA GEN_EXTRA "
    shift
    for a in "$@"; do
        printf 'arg.%d=%s\n' "$i" "$(_step_value "$a")"
        i=$((i + 1))
    done
    printf 'SMOKE=%s\n' "$SMOKE"
    printf 'reads=%s\n' "$reads"
    for var in $reads; do
        case $var in
            RAW) printf 'RAW=%s\n' "$(_step_value "$STEP_RAW")" ;;
            TRAIN_EXTRA|GEN_EXTRA) printf '%s=%s\n' "$var" "$(_step_value "${!var:-}")" ;;
            *) die "step_reads: unknown setting '$var' (TRAIN_EXTRA, GEN_EXTRA or RAW)" ;;
        esac
    done
    _step_settings "$seen"
}

# _step_record_v1 FUNCTION [ARGS...]: the record of the earlier marker format.
_step_record_v1() {
    local i=0 a
    for a in "$@"; do
        printf 'arg.%d=%s\n' "$i" "$(_step_value "$a")"
        i=$((i + 1))
    done
    printf 'SMOKE=%s\n' "$SMOKE"
    printf 'RAW=%s\n' "$(_step_value "$STEP_RAW")"
    printf 'TRAIN_EXTRA=%s\n' "$(_step_value "${TRAIN_EXTRA:-}")"
    printf 'GEN_EXTRA=%s\n' "$(_step_value "${GEN_EXTRA:-}")"
    _step_settings " SMOKE RAW TRAIN_EXTRA GEN_EXTRA "
}

# _step_settings SEEN: the RECIPE_SETTINGS lines (names in SEEN skipped).
_step_settings() {
    local seen=$1 var decl i
    for var in "${RECIPE_SETTINGS[@]}"; do
        [[ "$var" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] \
            || die "RECIPE_SETTINGS: '$var' is not a variable name (list the names of the settings, not their values)"
        case $seen in *" $var "*) continue ;; esac
        seen="$seen$var "
        decl=$(declare -p "$var" 2> /dev/null || true)
        case $decl in
            "declare -A"*) die "RECIPE_SETTINGS: $var is an associative array (not supported: list plain variables or indexed arrays)" ;;
            "declare -a"*)  # an indexed array: one line per element, NAME=() when empty
                local -n _step_arr=$var
                if [ ${#_step_arr[@]} -eq 0 ]; then printf '%s=()\n' "$var"; fi
                for i in "${!_step_arr[@]}"; do
                    printf '%s[%s]=%s\n' "$var" "$i" "$(_step_value "${_step_arr[$i]}")"
                done
                unset -n _step_arr ;;
            "") printf '%s=\n' "$var" ;;  # unset: recorded as empty
            *) printf '%s=%s\n' "$var" "$(_step_value "${!var}")" ;;
        esac
    done
}

# _step_mismatch NAME MARKER RECORD: stop, saying what differs from the done step's record.
_step_mismatch() {
    local name=$1 marker=$2 record=$3 line key diff="" later
    local -A old=() new=()
    local keys=()
    while IFS= read -r line; do
        case $line in '#'*|sha256=*|'') continue ;; esac
        key=${line%%=*}
        old[$key]=${line#*=}
        keys+=("$key")
    done < "$marker"
    while IFS= read -r line; do
        key=${line%%=*}
        new[$key]=${line#*=}
        [ -n "${old[$key]+x}" ] || keys+=("$key")
    done <<< "$record"
    later=$(find "$WORK/.done" -maxdepth 1 -type f ! -name '*.part' -newer "$marker" -printf '%T@ %f\n' \
        | sort -n | cut -d' ' -f2- | tr '\n' ' ')
    later=${later% }
    if [ ${#old[@]} -eq 0 ]; then
        diff=$'\n'"  $marker holds no record of its settings (written by an older version of the recipes): whether they match this run's cannot be told"
    else
        for key in "${keys[@]}"; do
            if [ "${old[$key]-<none>}" != "${new[$key]-<none>}" ]; then
                diff="$diff"$'\n'"  $key: done with '${old[$key]-<none>}', now '${new[$key]-<none>}'"
            fi
        done
        [ -n "$diff" ] || diff=$'\n'"  (the lines match, the sha256 does not: $marker was edited)"
    fi
    die "step $name was done with other settings than this run's:$diff
Its outputs, and those of every step after it, may not match this run's settings. Use another --workdir, or remove $marker and every later step's marker${later:+ (written after it: $later)} in $WORK/.done, and the checkpoint directories of the training steps among them, to redo them with these settings."
}

# atomic OUT COMMAND...: COMMAND's standard output to OUT, complete or not at all.
atomic() {
    local out=$1
    shift
    mkdir -p "$(dirname "$out")"
    if "$@" > "$out.part"; then
        mv "$out.part" "$out"
    else
        local rc=$?
        rm -f "$out.part"
        return "$rc"
    fi
}

# fetch URL DEST: download once; offline or failing: a clear message, nothing
# left. DEST.url keeps the URL DEST came from: an existing DEST asked for with
# another URL is an error naming both (not a silent re-download: the steps
# after the download read the old file, and their markers would not show it;
# remove DEST, or use another --workdir). A DEST without DEST.url (put there
# by hand, as the message below suggests) is used as it is, with a note.
fetch() {
    local url=$1 dest=$2 old
    if [ -s "$dest" ]; then
        if [ -e "$dest.url" ]; then
            old=$(cat "$dest.url")
            [ "$old" = "$url" ] || die "$dest was downloaded from $old, this run asks for $url: remove $dest (and redo the steps after the download) or use another --workdir"
        else
            log "$dest: present, with no record of its URL (put there by hand?): used as it is for $url"
        fi
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    command -v curl > /dev/null || die "curl is needed to download $url"
    if ! curl -fsSL --retry 2 --connect-timeout 20 -o "$dest.part" "$url"; then
        rm -f "$dest.part"
        die "cannot download $url (no network?). Download it by hand to $dest, or give the extracted files with --raw DIR, and re-run"
    fi
    printf '%s\n' "$url" > "$dest.url" || die "cannot write $dest.url"
    mv "$dest.part" "$dest"
}

# raw_file NAME: the path of an input file under --raw DIR (checked), else under $WORK/raw.
raw_file() {
    local dir=${RAW:-$WORK/raw}
    step_reads RAW
    [ -e "$dir/$1" ] || die "$dir/$1: no such file (expected from the download step or --raw)"
    printf '%s\n' "$dir/$1"
}

# need_raw_or_download: in --smoke mode nothing is downloaded.
smoke_needs_raw() {
    if [ "$SMOKE" = 1 ] && [ -z "$RAW" ]; then
        die "--smoke runs the local steps only: give the sample with --raw DIR"
    fi
}

# sample N IN OUT: the first N lines (smoke mode), else a copy.
sample_lines() {
    local n=$1 in=$2 out=$3
    if [ "$SMOKE" = 1 ]; then atomic "$out" head -n "$n" "$in"; else atomic "$out" cat "$in"; fi
}

# moses_tok LANG IN OUT [-a]: sacremoses tokenisation without XML escaping (as
# fairseq's prepare scripts run Moses with -no-escape; the sacremoses command
# line always escapes, so its Python API is used). XML entities in the text
# (&amp; &lt; &gt; &quot; &apos; &#NN; &#xNN;) are kept whole, as Moses'
# -protected patterns keep them, so that detokenisation, which never unescapes
# (moses_detokenize in ctx_fairseq/prep/corpora.py), gives them back as
# they were. -a: aggressive dash splits.
moses_tok() {
    local lang=$1 in=$2 out=$3
    shift 3
    atomic "$out" "$PY" -c '
import sys
from ctx_fairseq.prep.corpora import moses_tokenize
lang, dash = sys.argv[1], "-a" in sys.argv[2:]
for line in sys.stdin:
    print(moses_tokenize(line.rstrip("\n"), lang, aggressive_dash_splits=dash))' "$lang" "$@" < "$in"
}

# truecase_train MODEL FILE / truecase MODEL IN OUT
truecase_train() {
    if sacremoses -q -j 1 train-truecase -m "$1.part" < "$2"; then
        mv "$1.part" "$1"
    else
        local rc=$?
        rm -f "$1.part"
        return "$rc"
    fi
}
truecase() { atomic "$3" sacremoses -q -j 1 truecase -m "$1" < "$2"; }

# lowercase IN OUT
lowercase() { atomic "$2" "$PY" -c 'import sys
for line in sys.stdin: sys.stdout.write(line.lower())' < "$1"; }

# bpe_learn MERGES CODES FILE... : joint subword-nmt BPE over FILEs.
bpe_learn() {
    local merges=$1 codes=$2
    shift 2
    cat "$@" | atomic "$codes" subword-nmt learn-bpe -s "$merges"
}

# bpe_apply CODES IN OUT
bpe_apply() { atomic "$3" subword-nmt apply-bpe -c "$1" < "$2"; }

# preprocess SRC TGT PREFIX_DIR DEST [EXTRA...]: fairseq-preprocess of
# PREFIX_DIR/{train,valid,test}.{SRC,TGT}; {split}.docids are copied when present.
preprocess() {
    local src=$1 tgt=$2 dir=$3 dest=$4
    shift 4
    rm -rf "$dest.part"
    fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
        --trainpref "$dir/train" --validpref "$dir/valid" --testpref "$dir/test" \
        --destdir "$dest.part" --workers 2 "$@"
    local split
    for split in train valid test; do
        if [ -e "$dir/$split.docids" ]; then cp "$dir/$split.docids" "$dest.part/"; fi
    done
    rm -rf "$dest"
    mv "$dest.part" "$dest"
}

# transformer_shape LAYERS DIM FFN HEADS: a transformer's shape, the same in the
# encoder and the decoder (layers, embedding size, feed-forward size, attention
# heads), as fairseq-train options into the array SHAPE.
transformer_shape() {
    # shellcheck disable=SC2034  # read by the caller
    SHAPE=(--encoder-layers "$1" --decoder-layers "$1" --encoder-embed-dim "$2"
           --decoder-embed-dim "$2" --encoder-ffn-embed-dim "$3" --decoder-ffn-embed-dim "$3"
           --encoder-attention-heads "$4" --decoder-attention-heads "$4")
}

# train DATA SAVE_DIR ARGS...: fairseq-train with the plugin; log in $WORK/logs.
# SAVE_DIR/train.args records what the run depends on: DATA, the options
# (TRAIN_EXTRA included, --cpu not: resuming on another device is fine), the
# sha256 of DATA's dictionaries and, with --init-from-sentence-checkpoint X,
# of X; paths under the work directory as $WORK/... SAVE_DIR/train.done marks
# a finished run (fairseq-train exited 0). A finished SAVE_DIR is an error
# (fairseq-train would load its checkpoint_last.pt and train it further,
# rewriting checkpoint_best.pt under results computed from the old one); an
# interrupted run (checkpoint_last.pt, no train.done) resumes only with the
# same train.args, and a mismatch names the lines that differ.
train() {
    local data=$1 save=$2 record rc prev="" a dict sum
    shift 2
    step_reads TRAIN_EXTRA
    if [ -e "$save/train.done" ]; then
        die "$save: finished training (train.done): remove $save to train again (fairseq-train would train the finished run further and rewrite its checkpoint_best.pt)"
    fi
    mkdir -p "$save"
    record="data=$(_step_value "$data")"
    for a in "$@"; do
        if [ "$a" != --cpu ]; then record+=$'\n'"arg=$(_step_value "$a")"; fi
    done
    record+=$'\n'"TRAIN_EXTRA=$(_step_value "${TRAIN_EXTRA:-}")"
    for dict in "$data"/dict.*.txt; do
        [ -e "$dict" ] || continue
        sum=$(sha256sum < "$dict") || die "sha256sum $dict failed"
        record+=$'\n'"sha256 $(_step_value "$dict")=${sum%% *}"
    done
    for a in "$@" ""; do
        case $prev in
            --init-from-sentence-checkpoint) _train_init_sum "$a" ;;
        esac
        case $a in
            --init-from-sentence-checkpoint=*) _train_init_sum "${a#*=}" ;;
        esac
        prev=$a
    done
    record+=$_TRAIN_INIT_SUMS
    _TRAIN_INIT_SUMS=""
    if [ -e "$save/checkpoint_last.pt" ]; then
        if [ ! -e "$save/train.args" ]; then
            die "$save holds checkpoints of a training run whose options are unrecorded (no train.args); fairseq-train would resume it and ignore this run's. Remove $save (or use another --workdir) to train with these options"
        fi
        if [ "$(cat "$save/train.args")" != "$record" ]; then
            die "$save holds checkpoints of an interrupted training run with other settings; fairseq-train would resume it and ignore this run's. What differs (old = $save/train.args, new = this run):
$(diff <(cat "$save/train.args") <(printf '%s\n' "$record") | sed -n 's/^< /  old: /p; s/^> /  new: /p')
Remove $save (or use another --workdir) to train with these settings"
        fi
        log "$save: resuming the interrupted run (same settings)"
    fi
    printf '%s\n' "$record" > "$save/train.args.part" && mv "$save/train.args.part" "$save/train.args" \
        || die "cannot write $save/train.args"
    # a resumed run appends to the log of the run it resumes (the whole training in one log)
    local tee_opts=()
    [ -e "$save/checkpoint_last.pt" ] && tee_opts=(-a)
    # shellcheck disable=SC2086
    fairseq-train "$data" --user-dir "$USER_DIR" --save-dir "$save" "${CPU[@]}" \
        --log-format simple --log-interval 50 --data-buffer-size 0 "$@" ${TRAIN_EXTRA:-} \
        2>&1 | tee "${tee_opts[@]}" "$WORK/logs/train-$(basename "$save").log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || return "$rc"
    printf 'fairseq-train exited 0 at %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" > "$save/train.done"
}

# _train_init_sum CHECKPOINT: its sha256 line for train.args (into _TRAIN_INIT_SUMS).
_TRAIN_INIT_SUMS=""
_train_init_sum() {
    local sum
    [ -f "$1" ] || die "--init-from-sentence-checkpoint $1: no such file"
    sum=$(sha256sum < "$1") || die "sha256sum $1 failed"
    _TRAIN_INIT_SUMS+=$'\n'"sha256 $(_step_value "$1")=${sum%% *}"
}

# best_checkpoint SAVE_DIR: checkpoint_best.pt, else checkpoint_last.pt.
best_checkpoint() {
    if [ -e "$1/checkpoint_best.pt" ]; then echo "$1/checkpoint_best.pt"
    elif [ -e "$1/checkpoint_last.pt" ]; then
        log "$1: no checkpoint_best.pt (no validation?); using checkpoint_last.pt"
        echo "$1/checkpoint_last.pt"
    else die "$1: no checkpoint"; fi
}

# cuda_args: the array CUDA_ARGS=(--cuda) where the tools should use the GPU
# (no --cpu and torch sees CUDA), else (): for the evaluation tools that take
# --cuda. Computed once per shell (a step runs in a subshell: call it at the
# top level to share the answer between steps); torch not importable: an error.
# shellcheck disable=SC2034  # CUDA_ARGS is read by the callers
cuda_args() {
    local rc=0
    [ -z "${_CUDA_ARGS_KNOWN:-}" ] || return 0
    CUDA_ARGS=()
    if [ ${#CPU[@]} -eq 0 ]; then
        "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' || rc=$?
        case $rc in
            0) CUDA_ARGS=(--cuda) ;;
            3) ;;
            *) die "cannot import torch with $PY (exit $rc): is the environment activated?" ;;
        esac
    fi
    _CUDA_ARGS_KNOWN=1
}

# generate DATA CHECKPOINT SPLIT OUT ARGS...: fairseq-generate output to OUT.
generate() {
    local data=$1 ckpt=$2 split=$3 out=$4
    shift 4
    step_reads GEN_EXTRA
    # shellcheck disable=SC2086
    atomic "$out" fairseq-generate "$data" --user-dir "$USER_DIR" --path "$ckpt" \
        --gen-subset "$split" "${CPU[@]}" "$@" ${GEN_EXTRA:-}
}

# bleu GEN DOCIDS OUT_DIR [EXTRA...]: sentence- and document-level sacreBLEU
# (ctx-doc-bleu, with signatures) of fairseq-generate output.
bleu() {
    local gen=$1 docids=$2 out=$3
    shift 3
    ctx-doc-bleu "$gen" --docids "$docids" --out-dir "$out" "$@"
}

# Further shared steps, one file per topic (e.g. steps_docs.sh for document data).
for _steps in "$RECIPE_LIB_DIR"/steps_*.sh; do
    # shellcheck source=/dev/null
    [ -e "$_steps" ] && . "$_steps"
done
unset _steps
