#!/usr/bin/env bash
# OpenSubtitles2018 en-ru with the previous sentence as context (Voita,
# Serdyukov, Sennrich & Titov, ACL 2018): OPUS's XML release and sentence
# alignment, pairs with a time overlap of at least 0.9, the previous sentence
# as context only if its time is within 7 seconds, held-out movies for dev and
# test (10000 sentences each); the corpus's own tokenization, BPE per language
# (32000 merges); a Transformer-base sentence-level model, then the context-aware
# model (transformer_context_aware) initialised from it; sentence- and
# document-level BLEU, BLEU with true vs shuffled context, attention to context
# per word, contrastive test sets. See README.md.
set -euo pipefail

RECIPE_NAME=opensubtitles2018_en_ru
RECIPE_USAGE="usage: recipes/opensubtitles2018_en_ru/run.sh [--workdir DIR] [--raw DIR] [--smoke] [--cpu]

  --raw DIR   the files the download step would leave in WORKDIR/raw:
                DIR/opus/en-ru.xml.gz (or en-ru.xml)  OPUS's sentence alignment
                DIR/opus/en.zip, DIR/opus/ru.zip      the XML documents (or the
                                                      directories DIR/opus/en/, DIR/opus/ru/)
                DIR/contrastive/SUITE.json            Voita et al. (2019)'s test sets, one per
                                                      name in SUITES (optional in --smoke)
  --smoke     every local step on DIR's few lines, tiny model, a few updates
Environment: MIN_OVERLAP [0.9], MAX_GAP [7], GAP_FROM [start], VALID_SENTENCES [10000],
TEST_SENTENCES [10000], SPLIT_SEED [1], BPE_MERGES [32000], MAX_TOKENS [4096],
UPDATE_FREQ [6], MAX_UPDATE [100000], BEAM [4], SEED [1], SUITES, TRAIN_EXTRA,
GEN_EXTRA, PYTHON (see README.md)."
# shellcheck source=SCRIPTDIR/../lib/recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/recipe.sh"
recipe_init "$@"

SRC=en
TGT=ru
OPUS=${OPUS_URL:-https://object.pouta.csc.fi/OPUS-OpenSubtitles/v2018}
SUITES_URL=${SUITES_URL:-https://raw.githubusercontent.com/lena-voita/good-translation-wrong-in-context/master/consistency_testsets}
SUITES=${SUITES-deixis_test lex_cohesion_test ellipsis_infl ellipsis_vp}
MIN_OVERLAP=${MIN_OVERLAP:-0.9}
MAX_GAP=${MAX_GAP:-7}
GAP_FROM=${GAP_FROM:-start}
SPLIT_SEED=${SPLIT_SEED:-1}
SEED=${SEED:-1}
BEAM=${BEAM:-4}
if [ "$SMOKE" = 1 ]; then
    VALID_SENTENCES=${VALID_SENTENCES:-6}
    TEST_SENTENCES=${TEST_SENTENCES:-6}
    BPE_MERGES=${BPE_MERGES:-60}
    transformer_shape 2 32 64 2
    SCHEDULE=(--max-update "${SMOKE_UPDATES:-4}" --max-tokens "${MAX_TOKENS:-2000}"
              --lr-scheduler inverse_sqrt --warmup-updates 2 --lr 1e-3)
else
    VALID_SENTENCES=${VALID_SENTENCES:-10000}
    TEST_SENTENCES=${TEST_SENTENCES:-10000}
    BPE_MERGES=${BPE_MERGES:-32000}
    # Transformer base (Vaswani et al. 2017): 6+6 layers, d=512, 8 heads, FFN 2048
    transformer_shape 6 512 2048 8
    # lr = 512^-0.5 * min(step^-0.5, step * 4000^-1.5): peak 512^-0.5 * 4000^-0.5 = 6.99e-4
    SCHEDULE=(--max-update "${MAX_UPDATE:-100000}" --max-tokens "${MAX_TOKENS:-4096}"
              --update-freq "${UPDATE_FREQ:-6}" --lr-scheduler inverse_sqrt
              --warmup-updates 4000 --warmup-init-lr 1e-07 --lr 0.000699)
fi
OPTIM=(--optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-09 --label-smoothing 0.1
       --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 --seed "$SEED"
       --no-epoch-checkpoints --num-workers 0 "${SCHEDULE[@]}")
TASK_ARGS=(--task document_translation --source-context-size 1)
GEN=(--beam "$BEAM" --lenpen 0.6 --max-tokens "${GEN_MAX_TOKENS:-8000}" --num-workers 0)
# what the steps read besides their arguments (recorded in the step markers)
# SUITES is an argument of the steps that read it (download-suites, suites),
# so adding a suite redoes only those and the contrastive evaluation
RECIPE_SETTINGS+=(MIN_OVERLAP MAX_GAP GAP_FROM VALID_SENTENCES TEST_SENTENCES SPLIT_SEED)
read -r -a SUITE_LIST <<< "$SUITES"

# suite_files DIR: SUITE_FILES=(the contrastive test sets in DIR/contrastive):
# every set named in SUITES (one missing, or SUITES empty: an error saying
# which files are expected where); in --smoke whatever *.json is there, maybe none.
suite_files() {
    local dir=$1/contrastive s f missing=()
    SUITE_FILES=()
    if [ "$SMOKE" = 1 ]; then
        for f in "$dir"/*.json; do
            if [ -e "$f" ]; then SUITE_FILES+=("$f"); fi
        done
        return 0
    fi
    [ "${#SUITE_LIST[@]}" -gt 0 ] || die "SUITES is empty: name the Voita et al. (2019) contrastive test sets to score (default: deixis_test lex_cohesion_test ellipsis_infl ellipsis_vp)"
    for s in "${SUITE_LIST[@]}"; do
        if [ -e "$dir/$s.json" ]; then SUITE_FILES+=("$dir/$s.json"); else missing+=("$s.json"); fi
    done
    [ "${#missing[@]}" -eq 0 ] || die "the contrastive test sets are expected as $dir/SUITE.json for each SUITES name ($SUITES); missing: ${missing[*]}. Get them from $SUITES_URL (the download step fetches them), or set SUITES to the sets you have"
}

# download OPUS_URL: OPUS's OpenSubtitles2018 en-ru alignment and XML documents
# (the URL is the step's argument: its marker records it).
# Everything goes to raw.part/ first, renamed to raw/ when complete: an
# interrupted or failed download leaves raw/ as it was; the files already
# fetched stay in raw.part/ and are not fetched again.
download() {
    local opus=$1 d="$WORK/raw.part"
    fetch "$opus/xml/en-ru.xml.gz" "$d/opus/en-ru.xml.gz"
    fetch "$opus/xml/en.zip" "$d/opus/en.zip"
    fetch "$opus/xml/ru.zip" "$d/opus/ru.zip"
    if [ -d "$WORK/raw/contrastive" ]; then mv "$WORK/raw/contrastive" "$d/"; fi
    rm -rf "$WORK/raw"
    mv "$d" "$WORK/raw"
}

# download-suites SUITES_URL SUITE...: Voita et al. (2019)'s contrastive test
# sets into raw/contrastive/ (a step of its own: adding a suite to SUITES
# fetches it without redoing the corpus steps).
download_suites() {
    local url=$1 s
    shift
    [ "$#" -gt 0 ] || die "SUITES is empty: name the Voita et al. (2019) contrastive test sets to fetch"
    for s in "$@"; do
        fetch "$url/$s.json" "$WORK/raw/contrastive/$s.json"
    done
}

# prep: documents = runs of consecutive subtitles (ctx-prep-corpora opus), dev
# and test from movies not in training.
prep() {
    local raw=${RAW:-$WORK/raw} ali docs_args lang
    step_reads RAW
    docs_args=(--docs "$raw/opus")
    ali="$raw/opus/en-ru.xml.gz"
    [ -e "$ali" ] || ali="$raw/opus/en-ru.xml"
    ctx_need "$ali" "OPUS's OpenSubtitles2018 en-ru alignment (en-ru.xml.gz)"
    for lang in "$SRC" "$TGT"; do
        if [ -e "$raw/opus/$lang.zip" ]; then docs_args+=(--docs "$raw/opus/$lang.zip"); fi
    done
    ctx_prep_corpora opus --alignment "$ali" "${docs_args[@]}" --src-lang "$SRC" --tgt-lang "$TGT" \
        --min-overlap "$MIN_OVERLAP" --max-gap "$MAX_GAP" --gap-from "$GAP_FROM" \
        --out-dir "$WORK/docs" --valid-sentences "$VALID_SENTENCES" \
        --test-sentences "$TEST_SENTENCES" --seed "$SPLIT_SEED" --summary "$WORK/docs.summary.json"
    ctx_check_splits "$WORK/docs" "$SRC" "$TGT"
}

# refs: the test references detokenized for sacreBLEU (the corpus gives them
# only in its own tokenization) by the detokenizer of the hypotheses
# (moses_detokenize: sacremoses, nothing unescaped).
refs() {
    atomic "$WORK/docs/test.detok.$TGT" "$PY" -c 'import sys
from ctx_fairseq.prep.corpora import moses_detokenize
for line in sys.stdin:
    print(moses_detokenize(line, sys.argv[1]))' "$TGT" < "$WORK/docs/test.$TGT"
}

# suites: the contrastive test sets in the model's BPE units (one model per
# language), into suites/ (all or nothing: via suites.part/).
suites() {
    local raw=${RAW:-$WORK/raw}
    step_reads RAW
    suite_files "$raw"
    rm -rf "$WORK/suites" "$WORK/suites.part"
    if [ "${#SUITE_FILES[@]}" -eq 0 ]; then
        log "smoke: no contrastive test sets in $raw/contrastive (*.json): the contrastive evaluation is SKIPPED"
        return 0
    fi
    log "${#SUITE_FILES[@]} contrastive test set(s): ${SUITE_FILES[*]}"
    ctx_prep_corpora bpe-voita-suite "${SUITE_FILES[@]}" --out-dir "$WORK/suites.part" \
        --src-codes "$WORK/bpe/codes.$SRC" --tgt-codes "$WORK/bpe/codes.$TGT"
    mv "$WORK/suites.part" "$WORK/suites"
}

# contrastive: each suite, the sentence-level model (no context) and the
# context-aware model with true and with shuffled context.
contrastive() {
    local f name files=()
    # no results of sets scored before and not now
    rm -rf "$WORK/results/contrastive-sentence" "$WORK/results/contrastive-context"
    for f in "$WORK"/suites/*.json; do
        if [ -e "$f" ]; then files+=("$f"); fi
    done
    if [ "${#files[@]}" -eq 0 ]; then
        [ "$SMOKE" = 1 ] || die "no contrastive test sets in $WORK/suites (the suites step writes them from ${RAW:-$WORK/raw}/contrastive/SUITE.json)"
        log "smoke: no contrastive test sets: the contrastive evaluation is SKIPPED"
        return 0
    fi
    cuda_args
    for f in "${files[@]}"; do
        name=$(basename "$f" .json)
        ctx_contrastive_suite contrastive-sentence "$BIN" "$WORK/checkpoints/sentence" "$f" \
            "$name" --format voita --tokenizer none --bpe none "${CUDA_ARGS[@]}"
        ctx_contrastive_suite contrastive-context "$BIN" "$WORK/checkpoints/context" "$f" \
            "$name" --format voita --tokenizer none --bpe none "${CUDA_ARGS[@]}"
        ctx_contrastive_suite contrastive-context "$BIN" "$WORK/checkpoints/context" "$f" \
            "${name}_shuffled" --format voita --tokenizer none --bpe none \
            --context-ablation shuffled "${CUDA_ARGS[@]}"
    done
}

BIN="$WORK/data-bin"
if [ -n "$RAW" ]; then
    log "skip download (--raw $RAW)"
    # the contrastive sets are read after days of training: checked now
    suite_files "$RAW"
else
    smoke_needs_raw
    step download download "$OPUS"
fi
step prep prep
step refs refs
step bpe ctx_bpe_separate "$BPE_MERGES" "$SRC" "$TGT" "$WORK/docs" "$WORK/bpe"
step binarize preprocess "$SRC" "$TGT" "$WORK/bpe" "$BIN"
step train_sentence ctx_train_sentence "$BIN" "$WORK/checkpoints/sentence" --arch transformer \
    "${SHAPE[@]}" --criterion label_smoothed_cross_entropy "${OPTIM[@]}"
step train_context ctx_train_document "$BIN" "$WORK/checkpoints/context" "$WORK/checkpoints/sentence" \
    --arch transformer_context_aware "${SHAPE[@]}" "${TASK_ARGS[@]}" \
    --criterion label_smoothed_cross_entropy_ctx "${OPTIM[@]}"
step translate_sentence ctx_translate sentence "$BIN" "$WORK/checkpoints/sentence" test "${GEN[@]}"
step translate_context ctx_translate context "$BIN" "$WORK/checkpoints/context" test "${GEN[@]}" \
    "${TASK_ARGS[@]}"
step bleu_sentence ctx_bleu_report sentence "$BIN/test.docids" "$WORK/docs/test.$TGT" \
    "$WORK/docs/test.detok.$TGT" "$TGT"
step bleu_context ctx_bleu_report context "$BIN/test.docids" "$WORK/docs/test.$TGT" \
    "$WORK/docs/test.detok.$TGT" "$TGT"
# the summary's p column: the paired bootstrap of the context model against the
# sentence-level transformer (tokenized BLEU, over sentences and over documents)
step paired_context ctx_paired context "$WORK/docs/test.$TGT" "$BIN/test.docids"
step analysis_context ctx_context_aware_analyses analysis-context "$BIN" "$WORK/checkpoints/context" \
    "$BEAM" "$WORK/docs/test.$TGT" "--lenpen 0.6"
[ -n "$RAW" ] || step download-suites download_suites "$SUITES_URL" "${SUITE_LIST[@]}"
step suites suites "${SUITE_LIST[@]}"
step contrastive contrastive
ctx_summary "$WORK/results/summary.md"
log "done: $WORK/results/summary.md"
