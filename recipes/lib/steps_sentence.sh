# shellcheck shell=bash
# Sentence-level pipeline shared by the recipes of
#   Ampomah, McClean & Hawe (2021), Dual contextual module for NMT (the "DC paper"):
#     recipes/iwslt14_es_en, iwslt14_ro_en, iwslt15_en_vi, iwslt15_fr_en, wmt14_en_de
#   Xu, Wong, Yang, Zhang & Chao (ACL 2019), Leveraging local and global patterns
#   for self-attention networks (the "hybrid paper"):
#     recipes/wmt14_en_de, wat17_ja_en
# Sourced by recipes/lib/recipe.sh (every recipes/lib/steps_*.sh is); it builds on
# recipe.sh's step / atomic / fetch / moses_tok / bpe_* / preprocess / train /
# best_checkpoint / generate functions.
#
# A recipe (run.sh) sets its configuration, calls `recipe_init "$@"`, registers
# its models with `sent_model`, and runs `sent_pipeline`, then its analyses
# (`sent_by_length`, `sent_dc_jsd`, `sent_probe`, `sent_hybrid_gates`,
# `sent_window_sweep`) and `sent_summary`.
#
# Work directory layout ($WORK):
#   download/                 archives as fetched (kept; fetch skips them next time)
#   raw/                      the extracted archives (the download step; or --raw DIR)
#   text/{train,valid,test}.{L1,L2}   plain parallel text, one sentence a line
#   tok/                      tokenised (sacremoses, KyTea or a copy)
#   bpe/codes, bpe/{split}.{L}        joint subword-nmt BPE
#   bin/                      fairseq-preprocess, joined dictionary
#   bin-sep/                  fairseq-preprocess, one dictionary per language
#   ckpt/<SRC>-<TGT>.<MODEL>/ checkpoints; logs/train-<SRC>-<TGT>.<MODEL>.log
#   results/<SRC>-<TGT>/<MODEL>/{generate-test.txt,hyp.tok,hyp.detok,bleu.txt,bleu.json}
#   results/summary.{md,json}, analysis/...
#
# Recipe configuration (variables set before sent_pipeline):
#   SENT_L1 SENT_L2            the two languages of text/ (e.g. es en)
#   SENT_DEFAULT_DIRECTIONS    e.g. "es-en en-es" (env DIRECTIONS overrides)
#   SENT_MERGES                BPE merge operations (smoke: SENT_SMOKE_MERGES, 300)
#   SENT_TOKENIZER_<LANG>      moses (default) | kytea | none
#   SENT_DOWNLOAD_FN           function of the download step (full mode without --raw)
#   SENT_TEXT_FN               function writing text/{train,valid,test}.{L1,L2}
#   SENT_DETOK                 1: sacreBLEU on sacremoses-detokenised hypotheses
#                              against text/test (raw); 0: the text is distributed
#                              tokenised, hypotheses are scored as they are
#   SENT_TOK_BLEU              1: also tokenized BLEU (the paper's multi-bleu metric)
#   SENT_TOK_BLEU_LABEL        how the paper names it
#   SENT_PAPER                 a line naming the paper and tables, for the summary
#   SENT_DEFAULT_MODELS        models run when env MODELS is not set
#   sent_group NAME DATA "TRAIN OPTIONS" "GENERATE OPTIONS"   (one per training set-up)
#   sent_model ID LABEL GROUP FAMILY "MODEL OPTIONS"           (one per model)
# Environment read: MODELS, DIRECTIONS (space-separated lists).
#
# Step markers (recipes/lib/recipe.sh) record what each step used: the train
# and test steps get their resolved options as arguments, the BPE step its
# merges, and sent_pipeline adds the recipe-wide settings above (languages,
# tokenizers, text sources, scoring) to RECIPE_SETTINGS. A recipe adds its own
# (e.g. KYTEA_MODEL) to RECIPE_SETTINGS before sent_pipeline.

SENT_SMOKE_LINES=${SENT_SMOKE_LINES:-400}
SENT_SMOKE_MERGES=${SENT_SMOKE_MERGES:-300}
# The tiny model and the few updates of --smoke (appended after a model's own
# options, so they override its shape and schedule).
SENT_SMOKE_TRAIN="--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 \
--decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 \
--encoder-attention-heads 2 --decoder-attention-heads 2 --max-update 12 --warmup-updates 4 \
--max-tokens 600 --update-freq 1 --num-workers 0"
SENT_SMOKE_GEN="--max-tokens 2000"

declare -A SENT_LABEL=() SENT_GROUP=() SENT_FAMILY=() SENT_OPTS=()
declare -A SENT_GROUP_DATA=() SENT_GROUP_TRAIN=() SENT_GROUP_GEN=()
SENT_ALL_MODELS=()

# sent_group NAME DATA TRAIN_OPTIONS GEN_OPTIONS: a training set-up (a paper's
# optimiser, schedule, batch, regularisation; its beam and length penalty).
# DATA is bin (joined dictionary) or bin-sep (one dictionary per language).
sent_group() {
    SENT_GROUP_DATA[$1]=$2
    SENT_GROUP_TRAIN[$1]=$3
    SENT_GROUP_GEN[$1]=$4
}

# sent_model ID LABEL GROUP FAMILY OPTIONS: a model (architecture and its options).
# FAMILY groups the summary's tables: main, or e.g. kernel=3, layers=1-2, table1.
sent_model() {
    [ -n "${SENT_GROUP_DATA[$3]:-}" ] || die "sent_model $1: unknown group $3"
    SENT_LABEL[$1]=$2
    SENT_GROUP[$1]=$3
    SENT_FAMILY[$1]=$4
    SENT_OPTS[$1]=$5
    SENT_ALL_MODELS+=("$1")
}

# sent_select: the models and directions of this run into SENT_MODELS and
# SENT_DIRS (env MODELS / DIRECTIONS, else the recipe's defaults; checked).
sent_select() {
    local m d
    SENT_MODELS=()
    SENT_DIRS=()
    for m in ${MODELS:-$SENT_DEFAULT_MODELS}; do
        [ -n "${SENT_LABEL[$m]:-}" ] || die "MODELS: unknown model '$m'; this recipe knows: ${SENT_ALL_MODELS[*]}"
        SENT_MODELS+=("$m")
    done
    [ ${#SENT_MODELS[@]} -gt 0 ] || die "no models selected (MODELS is empty)"
    for d in ${DIRECTIONS:-$SENT_DEFAULT_DIRECTIONS}; do
        case $d in
            "$SENT_L1-$SENT_L2"|"$SENT_L2-$SENT_L1") SENT_DIRS+=("$d") ;;
            *) die "DIRECTIONS: '$d' is neither $SENT_L1-$SENT_L2 nor $SENT_L2-$SENT_L1" ;;
        esac
    done
    [ ${#SENT_DIRS[@]} -gt 0 ] || die "no directions selected (DIRECTIONS is empty)"
}

# sent_baseline_of ID: the sentence-level transformer of ID's set-up (the
# model of the same group whose id is transformer or ends in -transformer),
# printed when it is among this run's models and is not ID itself.
sent_baseline_of() {
    local m
    for m in "${SENT_MODELS[@]}"; do
        case $m in transformer|*-transformer) ;; *) continue ;; esac
        if [ "${SENT_GROUP[$m]}" = "${SENT_GROUP[$1]}" ] && [ "$m" != "$1" ]; then
            printf '%s\n' "$m"
            return 0
        fi
    done
    return 1
}

# sent_paired DIRECTION ID BASELINE: sacreBLEU's paired bootstrap (Koehn 2004;
# ctx_fairseq.eval.scoring.significance) of ID's detokenised test hypotheses against
# BASELINE's, with the sacreBLEU tokenizer of ID's score, into
# results/DIRECTION/ID/paired.json (sentences only: these corpora have no
# documents here)
sent_paired() {
    local dir=$1 id=$2 base=$3 out tok
    out="$WORK/results/$dir/$id"
    tok=$(sed -n 's/.*tok:\([^|"]*\).*/\1/p' "$out/bleu.json" | head -n 1)
    "$PY" -m ctx_fairseq.eval.scoring.significance --baseline "$WORK/results/$dir/$base/hyp.detok" \
        --system "$out/hyp.detok" --refs "$WORK/text/test.${dir#*-}" --tokenize "${tok:-13a}" \
        --out "$out/paired.json" > "$out/paired.log" 2>&1 \
        || die "paired bootstrap of $dir/$id failed (see $out/paired.log)"
}

# sent_has_model ID: is ID among this run's models?
sent_has_model() {
    local m
    for m in "${SENT_MODELS[@]}"; do [ "$m" = "$1" ] && return 0; done
    return 1
}

# ------------------------------------------------------------------ raw files

# sent_find PATTERN: the one file under the raw directory (--raw DIR, else
# $WORK/raw) whose name matches PATTERN (searched recursively). None or several:
# an error saying so.
sent_find() {
    local root=${RAW:-$WORK/raw} found=()
    step_reads RAW
    [ -d "$root" ] || die "$root: no such directory (the download step writes it; or give --raw DIR)"
    mapfile -t found < <(find -L "$root" -type f -name "$1" | LC_ALL=C sort)
    case ${#found[@]} in
        1) printf '%s\n' "${found[0]}" ;;
        0) die "no file named '$1' under $root (expected from the download step or --raw DIR; see the recipe's README for the layout)" ;;
        *) die "'$1' matches ${#found[@]} files under $root: ${found[*]}; keep one" ;;
    esac
}

# sent_fetch URL NAME: fetch URL to $WORK/download/NAME (once).
sent_fetch() { fetch "$1" "$WORK/download/$2"; }

# sent_unpack ARCHIVE...: extract the fetched archives (tar.gz, or a plain file
# copied) into $WORK/raw, all or nothing (via $WORK/raw.part).
sent_unpack() {
    local a part="$WORK/raw.part"
    rm -rf "$part"
    mkdir -p "$part"
    for a in "$@"; do
        case $a in
            *.tgz|*.tar.gz)
                if ! tar -xzf "$WORK/download/$a" -C "$part"; then
                    rm -rf "$part"
                    die "cannot extract $WORK/download/$a (a damaged download? delete it and re-run)"
                fi ;;
            *)
                mkdir -p "$part/$(dirname "$a")"
                cp "$WORK/download/$a" "$part/$a" ;;
        esac
    done
    rm -rf "$WORK/raw"
    mv "$part" "$WORK/raw"
}

# ------------------------------------------------------------------ Python helper

# sent_py COMMAND ARGS...: the Python helpers of these steps, one command per
# call: extract (the text of a split from the raw files: python -m
# ctx_fairseq.prep.recipe_text), evaluate, bylength and summary (scoring and
# reports: python -m ctx_fairseq.eval.scoring.recipe_report); see those modules.
sent_py() {
    case $1 in
        extract) "$PY" -m ctx_fairseq.prep.recipe_text "$@" ;;
        *) "$PY" -m ctx_fairseq.eval.scoring.recipe_report "$@" ;;
    esac
}

# sent_extract SPLIT [--drop-empty] --src KIND:FILE --tgt KIND:FILE ...: write
# text/SPLIT.{L1,L2} (in --smoke: the first SENT_SMOKE_LINES pairs).
sent_extract() {
    local split=$1 max=0
    shift
    [ "$SMOKE" = 1 ] && max=$SENT_SMOKE_LINES
    sent_py extract --out-prefix "$WORK/text/$split" --l1 "$SENT_L1" --l2 "$SENT_L2" \
        --max-lines "$max" "$@"
}

# ------------------------------------------------------------------ local steps

sent_tokenizer_of() {
    local var="SENT_TOKENIZER_$1"
    printf '%s\n' "${!var:-moses}"
}

# Tokenise text/ into tok/ (each language with its tokenizer).
sent_tokenize() {
    local split lang tokenizer kytea_opts=()
    mkdir -p "$WORK/tok"
    for lang in "$SENT_L1" "$SENT_L2"; do
        tokenizer=$(sent_tokenizer_of "$lang")
        for split in train valid test; do
            case $tokenizer in
                moses) moses_tok "$lang" "$WORK/text/$split.$lang" "$WORK/tok/$split.$lang" ;;
                kytea)
                    command -v kytea > /dev/null || die "KyTea (the command kytea) is not installed, and the $lang side must be segmented into words with it (the paper's segmenter). Install KyTea (http://www.phontron.com/kytea/) with its Japanese model (or set KYTEA_MODEL=FILE), or segment the text yourself and re-run with --ja-segmented; see the recipe's README"
                    kytea_opts=(-out tok)
                    if [ -n "${KYTEA_MODEL:-}" ]; then kytea_opts+=(-model "$KYTEA_MODEL"); fi
                    atomic "$WORK/tok/$split.$lang" kytea "${kytea_opts[@]}" < "$WORK/text/$split.$lang" ;;
                none) atomic "$WORK/tok/$split.$lang" cat "$WORK/text/$split.$lang" ;;
                *) die "SENT_TOKENIZER_$lang: unknown tokenizer '$tokenizer'" ;;
            esac
            [ "$(wc -l < "$WORK/tok/$split.$lang")" = "$(wc -l < "$WORK/text/$split.$lang")" ] \
                || die "$WORK/tok/$split.$lang: the tokenizer changed the number of lines"
        done
    done
}

# sent_bpe MERGES: joint BPE, learned on the tokenised training text of both languages.
sent_bpe() {
    local merges=$1 split lang
    bpe_learn "$merges" "$WORK/bpe/codes" "$WORK/tok/train.$SENT_L1" "$WORK/tok/train.$SENT_L2"
    for split in train valid test; do
        for lang in "$SENT_L1" "$SENT_L2"; do
            bpe_apply "$WORK/bpe/codes" "$WORK/tok/$split.$lang" "$WORK/bpe/$split.$lang"
        done
    done
}

# sent_binarize DATA: fairseq-preprocess of bpe/ into DATA (bin: joined dictionary).
sent_binarize() {
    local extra=()
    [ "$1" = bin ] && extra=(--joined-dictionary)
    preprocess "$SENT_L1" "$SENT_L2" "$WORK/bpe" "$WORK/$1" "${extra[@]}"
}

sent_ckpt_dir() { printf '%s\n' "$WORK/ckpt/$1.$2"; }

# sent_train_args MODEL / sent_gen_args MODEL: the resolved fairseq options of
# MODEL (its own, then its group's) into SENT_ARGS: the train and test steps
# get them as arguments, so that their markers record them.
sent_train_args() {
    local opts=() gopts=()
    read -r -a opts <<< "${SENT_OPTS[$1]}"
    read -r -a gopts <<< "${SENT_GROUP_TRAIN[${SENT_GROUP[$1]}]}"
    SENT_ARGS=("${opts[@]}" "${gopts[@]}")
}
sent_gen_args() { read -r -a SENT_ARGS <<< "${SENT_GROUP_GEN[${SENT_GROUP[$1]}]}"; }

# sent_train DIRECTION MODEL DATA [TRAIN OPTIONS...] (in --smoke the tiny model
# and the few updates go last)
sent_train() {
    local dir=$1 id=$2 data=$3 tiny=()
    shift 3
    [ "$SMOKE" = 1 ] && read -r -a tiny <<< "$SENT_SMOKE_TRAIN"
    train "$WORK/$data" "$(sent_ckpt_dir "$dir" "$id")" \
        --source-lang "${dir%-*}" --target-lang "${dir#*-}" \
        "$@" --no-epoch-checkpoints --seed 1 "${tiny[@]}"
}

# sent_test DIRECTION MODEL DATA [GENERATE OPTIONS...]: translate the test set and score it.
sent_test() {
    local dir=$1 id=$2 data=$3 src tgt out ckpt tiny=() tok=()
    shift 3
    src=${dir%-*}
    tgt=${dir#*-}
    out="$WORK/results/$dir/$id"
    mkdir -p "$out"
    ckpt=$(best_checkpoint "$(sent_ckpt_dir "$dir" "$id")")
    [ "$SMOKE" = 1 ] && read -r -a tiny <<< "$SENT_SMOKE_GEN"
    generate "$WORK/$data" "$ckpt" test "$out/generate-test.txt" \
        --source-lang "$src" --target-lang "$tgt" "$@" --remove-bpe \
        --max-tokens 4096 "${tiny[@]}"
    [ "$SENT_TOK_BLEU" = 1 ] && tok=(--tok-ref "$WORK/tok/test.$tgt" --tok-label "$SENT_TOK_BLEU_LABEL")
    sent_py evaluate --gen "$out/generate-test.txt" --ref "$WORK/text/test.$tgt" --lang "$tgt" \
        --detok "$SENT_DETOK" --out-dir "$out" "${tok[@]}" \
        --title "$RECIPE_NAME $dir $id (${SENT_LABEL[$id]}), checkpoint $ckpt" \
        --meta "recipe=$RECIPE_NAME" --meta "direction=$dir" --meta "model=$id" \
        --meta "checkpoint=$ckpt" --meta "smoke=$SMOKE"
}

# sent_settings: the recipe-wide settings the steps read into RECIPE_SETTINGS
# (those of the text sources only where the recipe sets them).
sent_settings() {
    local v
    # the tokenizers as used (moses where the recipe names none)
    for v in "$SENT_L1" "$SENT_L2"; do printf -v "SENT_TOKENIZER_$v" '%s' "$(sent_tokenizer_of "$v")"; done
    RECIPE_SETTINGS+=(SENT_L1 SENT_L2 "SENT_TOKENIZER_$SENT_L1" "SENT_TOKENIZER_$SENT_L2"
                      SENT_DETOK SENT_TOK_BLEU)
    [ "$SMOKE" = 1 ] && RECIPE_SETTINGS+=(SENT_SMOKE_LINES)
    for v in SENT_WIT3_PAIR SENT_WIT3_VALID SENT_WIT3_TEST SENT_PLAIN_TRAIN SENT_PLAIN_VALID \
             SENT_PLAIN_TEST; do
        if [ -n "${!v+x}" ]; then RECIPE_SETTINGS+=("$v"); fi
    done
}

# The pipeline: download (full mode without --raw), text, tok, bpe, bin[, bin-sep],
# then train + test per direction and model.
sent_pipeline() {
    local dir id base datas=() merges=$SENT_MERGES
    sent_select
    sent_settings
    if [ -z "$RAW" ]; then
        smoke_needs_raw
        # the files and URLs as arguments: the marker records them
        step download "$SENT_DOWNLOAD_FN" "${SENT_FILES[@]+"${SENT_FILES[@]}"}"
    else
        log "raw files from --raw $RAW (no download)"
    fi
    step text "$SENT_TEXT_FN"
    step tok sent_tokenize
    [ "$SMOKE" = 1 ] && merges=$SENT_SMOKE_MERGES
    step bpe sent_bpe "$merges"
    for id in "${SENT_MODELS[@]}"; do
        case " ${datas[*]} " in *" ${SENT_GROUP_DATA[${SENT_GROUP[$id]}]} "*) ;; *) datas+=("${SENT_GROUP_DATA[${SENT_GROUP[$id]}]}") ;; esac
    done
    for id in "${datas[@]}"; do step "$id" sent_binarize "$id"; done
    for dir in "${SENT_DIRS[@]}"; do
        for id in "${SENT_MODELS[@]}"; do
            sent_train_args "$id"
            step "train-$dir-$id" sent_train "$dir" "$id" "${SENT_GROUP_DATA[${SENT_GROUP[$id]}]}" "${SENT_ARGS[@]}"
            sent_gen_args "$id"
            step "test-$dir-$id" sent_test "$dir" "$id" "${SENT_GROUP_DATA[${SENT_GROUP[$id]}]}" "${SENT_ARGS[@]}"
        done
        # every model against its set-up's transformer: the summary's p column
        for id in "${SENT_MODELS[@]}"; do
            if base=$(sent_baseline_of "$id"); then
                step "paired-$dir-$id" sent_paired "$dir" "$id" "$base"
            fi
        done
    done
}

# ------------------------------------------------------------------ analyses

# sent_by_length DIRECTION MODEL...: BLEU by source length (DC paper Sec. 7.4,
# Fig. 5): buckets by the number of BPE tokens of the source (as the paper),
# scored with sacreBLEU on the detokenised hypotheses against the references.
sent_by_length() {
    local dir=$1 id systems=() out="$WORK/analysis/by_length/$1"
    shift
    mkdir -p "$out"
    for id in "$@"; do
        systems+=(--system "${SENT_LABEL[$id]}|$WORK/results/$dir/$id/generate-test.txt|$WORK/results/$dir/$id/hyp.detok")
    done
    sent_py bylength --src "$WORK/bpe/test.${dir%-*}" --ref "$WORK/text/test.${dir#*-}" \
        --out-dir "$out" "${systems[@]}"
}

# sent_dc_jsd DIRECTION MODEL|LABEL...: Jensen-Shannon divergence between the
# global and local attention of each DC encoder layer (DC paper Eq. 10-13, Fig. 4).
sent_dc_jsd() {
    local dir=$1 spec ckpt args=()
    shift
    for spec in "$@"; do
        ckpt=$(best_checkpoint "$(sent_ckpt_dir "$dir" "${spec%%|*}")")
        args+=(--path "$ckpt" --label "${spec#*|}")
    done
    "$PY" -m ctx_fairseq.eval.analyses.dc_jsd "$WORK/bin" "${args[@]}" --split test \
        --out-dir "$WORK/analysis/dc_jsd" "${CPU[@]}"
}

# sent_probe_files: SentEval's probing files (raw/probing/*.txt, from the download
# step or --raw) as ctx-probe reads them: the split, the label and the last field
# (the sentence), in analysis/probing_data/.
sent_probe_files() {
    local f n=0 root=${RAW:-$WORK/raw} files=()
    step_reads RAW
    mapfile -t files < <(find -L "$root" -path '*probing/*.txt' -type f | LC_ALL=C sort)
    [ ${#files[@]} -gt 0 ] || die "no probing/*.txt under $root (SentEval's data/probing files; see the README)"
    mkdir -p "$WORK/analysis/probing_data"
    for f in "${files[@]}"; do
        # shellcheck disable=SC2016  # awk's own $1, $2, $NF
        atomic "$WORK/analysis/probing_data/$(basename "$f")" \
            awk -F'\t' -v OFS='\t' 'NF >= 3 { print $1, $2, $NF; next } NF > 0 { print; }' "$f"
        n=$((n + 1))
    done
    log "probing tasks: $n file(s)"
}

# sent_probe DIRECTION MODEL [ctx-probe options]: probing tasks on the frozen,
# mean-pooled encoder (DC paper Sec. 7.1 / Table 4; hybrid paper Sec. 5.1 /
# Tables 3-4). SentEval's sentences are Moses-tokenised: only BPE is applied.
sent_probe() {
    local dir=$1 id=$2 group ckpt tiny=()
    shift 2
    group=${SENT_GROUP[$id]}
    ckpt=$(best_checkpoint "$(sent_ckpt_dir "$dir" "$id")")
    [ "$SMOKE" = 1 ] && tiny=(--max-epochs 3 --patience 2)
    # the encoder on the GPU where fairseq would use one (no --cpu, CUDA available)
    cuda_args
    "$PY" -m ctx_fairseq.eval.analyses.probe run --path "$ckpt" "${CUDA_ARGS[@]}" \
        --data "$WORK/${SENT_GROUP_DATA[$group]}" --task-file "$WORK/analysis/probing_data" \
        --tokenizer none --bpe subword_nmt --bpe-codes "$WORK/bpe/codes" \
        --out-dir "$WORK/analysis/probe/$id" "$@" "${tiny[@]}"
}

# sent_hybrid_gates DIRECTION MODEL OUT [--pos-tags FILE]: mean gate per layer on
# the validation set (hybrid paper Fig. 3) and, with tags, by POS (Fig. 4).
sent_hybrid_gates() {
    local dir=$1 id=$2 out=$3 ckpt
    shift 3
    ckpt=$(best_checkpoint "$(sent_ckpt_dir "$dir" "$id")")
    "$PY" -m ctx_fairseq.eval.analyses.hybrid_gates "$WORK/${SENT_GROUP_DATA[${SENT_GROUP[$id]}]}" \
        --path "$ckpt" --split valid \
        --out-dir "$out" "${CPU[@]}" "$@"
}

# sent_check_pos_tags FILE: one line per validation sentence, one tag per
# tokenised source word (tok/valid.SRC).
sent_check_pos_tags() {
    local tags=$1 src=$2
    [ -f "$tags" ] || die "POS_TAGS=$tags: no such file"
    [ "$(wc -l < "$tags")" = "$(wc -l < "$WORK/tok/valid.$src")" ] \
        || die "POS_TAGS=$tags has $(wc -l < "$tags") lines, $WORK/tok/valid.$src has $(wc -l < "$WORK/tok/valid.$src") (one line of tags per validation sentence)"
}

# sent_window_sweep DIRECTION ARCH WINDOWS MAX_UPDATE DATA "TRAIN OPTIONS" "GEN OPTIONS":
# the hybrid paper's Fig. 2 on this recipe's DATA (bin or bin-sep) with a
# training set-up (e.g. "$SENT_HYB_TRAIN" "$SENT_HYB_GEN"): hyb_window_sweep
# into $WORK/analysis/window_sweep, one model per window m (ARCH --hybrid-window
# m, MAX_UPDATE updates; in --smoke the tiny model), the validation set
# translated and scored as sent_test scores the test set: sacreBLEU of the
# detokenised hypotheses against text/valid.TGT and, where the recipe reports
# it (SENT_TOK_BLEU), tokenized BLEU against tok/valid.TGT.
sent_window_sweep() {
    local dir=$1 arch=$2 windows=$3 max_update=$4 data=$5 src tgt tr=() ge=() tiny=() gtiny=() tok=()
    src=${dir%-*}
    tgt=${dir#*-}
    read -r -a tr <<< "$6"
    read -r -a ge <<< "$7"
    if [ "$SMOKE" = 1 ]; then
        read -r -a tiny <<< "$SENT_SMOKE_TRAIN"
        read -r -a gtiny <<< "$SENT_SMOKE_GEN"
    fi
    if [ "$SENT_TOK_BLEU" = 1 ]; then
        tok=(--tok-ref "$WORK/tok/valid.$tgt" --tok-label "$SENT_TOK_BLEU_LABEL"
             --meta "tokenized_reference=$WORK/tok/valid.$tgt")
    fi
    hyb_window_sweep "$WORK/analysis/window_sweep" "$windows" "$WORK/$data" valid "" \
        --arch "$arch" --source-lang "$src" --target-lang "$tgt" "${tr[@]}" \
        --max-update "$max_update" --no-epoch-checkpoints --seed 1 "${tiny[@]}" \
        ::gen --source-lang "$src" --target-lang "$tgt" "${ge[@]}" --remove-bpe \
        --max-tokens 4096 "${gtiny[@]}" \
        ::eval --ref "$WORK/text/valid.$tgt" --lang "$tgt" --detok "$SENT_DETOK" "${tok[@]}" \
        --meta "recipe=$RECIPE_NAME" --meta "direction=$dir" --meta "smoke=$SMOKE"
}

# hyb_window_sweep SWEEP_DIR WINDOWS DATA SPLIT CKPT TRAIN_OPTIONS... ::gen
# GEN_OPTIONS... ::eval EVAL_OPTIONS...: the window sweep of transformer_hybrid
# (hybrid paper Fig. 2), for sent_window_sweep and recipes/hybrid_window_sweep.sh.
# Each window m of WINDOWS is a step of its own (hyb_sweep_window), with its
# marker in SWEEP_DIR/.done/m<M> (SWEEP_DIR is the work directory of these
# steps: a re-run skips a finished window done with the same settings and
# stops at one done with others, as the recipes' steps do); then the summary
# SWEEP_DIR/hybrid_window_sweep.{tsv,json,md,png} of this run's windows
# (ctx-hybrid-gates sweep; always rewritten). CKPT: the checkpoint file name
# to evaluate ("" = checkpoint_best.pt, else checkpoint_last.pt). EVAL_OPTIONS:
# sent_py evaluate's (--ref, --lang, --detok, [--tok-ref, --tok-label], --meta).
hyb_window_sweep() {
    local sweep=$1 windows=$2 data=$3 split=$4 ckpt=$5 m runs=() WORK
    shift 5
    mkdir -p "$sweep/.done" "$sweep/logs"
    WORK=$(cd "$sweep" && pwd)
    for m in $windows; do
        [[ "$m" =~ ^[0-9]+$ ]] || die "WINDOWS: '$m' is not a non-negative integer"
    done
    [ -n "${windows// /}" ] || die "WINDOWS is empty"
    for m in $windows; do
        log "window sweep: m=$m (window size $((2 * m + 1)))"
        step "m$m" hyb_sweep_window "$m" "$data" "$WORK/ckpt/m$m" "$WORK/m$m" "$split" "$ckpt" \
            ::train "$@"
        runs+=("$m=$WORK/m$m")
    done
    "$PY" -m ctx_fairseq.eval.analyses.hybrid_gates sweep "${runs[@]}" --out-dir "$WORK"
}

# hyb_sweep_window M DATA SAVE RUN SPLIT CKPT ::train TRAIN... ::gen GEN... ::eval EVAL...:
# one window: train (recipe.sh's train, with --hybrid-window M last) into SAVE,
# translate SPLIT into RUN/generate-SPLIT.txt (generate), score it (sent_py
# evaluate: RUN/{hyp.tok,hyp.detok,bleu.txt,bleu.json}) and measure its gates
# (RUN/hybrid_gates_by_layer.*).
hyb_sweep_window() {
    local m=$1 data=$2 save=$3 run=$4 split=$5 ckpt=$6 part="" a tr=() ge=() ev=()
    shift 6
    for a in "$@"; do
        case $a in
            ::train|::gen|::eval) part=$a; continue ;;
        esac
        case $part in
            ::train) tr+=("$a") ;;
            ::gen) ge+=("$a") ;;
            ::eval) ev+=("$a") ;;
            *) die "hyb_sweep_window: options before ::train" ;;
        esac
    done
    train "$data" "$save" "${tr[@]}" --hybrid-window "$m"
    if [ -n "$ckpt" ]; then
        ckpt="$save/$ckpt"
        [ -f "$ckpt" ] || die "CKPT: $ckpt: no such checkpoint"
    else
        ckpt=$(best_checkpoint "$save")
    fi
    mkdir -p "$run"
    generate "$data" "$ckpt" "$split" "$run/generate-$split.txt" "${ge[@]}"
    sent_py evaluate --gen "$run/generate-$split.txt" --out-dir "$run" "${ev[@]}" \
        --title "window sweep m=$m (window size $((2 * m + 1))), $split, checkpoint $ckpt" \
        --meta "window=$m" --meta "checkpoint=$ckpt"
    "$PY" -m ctx_fairseq.eval.analyses.hybrid_gates "$data" --path "$ckpt" --split "$split" \
        --out-dir "$run" "${CPU[@]}"
}

# sent_summary: results/summary.{md,json} from every scored model (always rewritten).
# SENT_SUMMARY_ALSO: "FAMILY:MODEL" entries listing a model in a second table.
SENT_SUMMARY_ALSO=()
sent_summary() {
    local id models=() label=""
    for id in "${SENT_ALL_MODELS[@]}"; do
        models+=(--model "$id|${SENT_LABEL[$id]}|${SENT_FAMILY[$id]}|${SENT_GROUP[$id]}")
    done
    for id in "${SENT_SUMMARY_ALSO[@]}"; do models+=(--also "$id"); done
    [ "$SENT_TOK_BLEU" = 1 ] && label=$SENT_TOK_BLEU_LABEL
    log "summary (rewritten on every run)"
    sent_py summary --work "$WORK" --name "$RECIPE_NAME" --paper "$SENT_PAPER" "${models[@]}" \
        --directions "$SENT_L1-$SENT_L2 $SENT_L2-$SENT_L1" --tok-label "$label" --smoke "$SMOKE" \
        > /dev/null
    log "results: $WORK/results/summary.md"
}

# ------------------------------------------------------------------ data sources

# sent_part KIND PATTERN: KIND:PATH of the one raw file matching PATTERN.
sent_part() {
    local f
    f=$(sent_find "$2")
    printf '%s:%s\n' "$1" "$f"
}

# WIT3 (IWSLT TED talks) releases (downloaded with sent_download_files). Configuration:
#   SENT_WIT3_PAIR      the pair as WIT3 names its files, e.g. es-en
#   SENT_WIT3_VALID     sets concatenated into the validation set, e.g. "dev2010 tst2010"
#   SENT_WIT3_TEST      sets concatenated into the test set, e.g. "tst2014"
# Training text: train.tags.PAIR.{L1,L2} without its metadata lines (those
# starting with '<': url, keywords, speaker, talkid, title, description, ...),
# pairs with an empty side dropped. Dev/test sets: the <seg> elements of
# IWSLT*.TED.SET.PAIR.LANG.xml (searched recursively under the raw directory).
sent_text_wit3() {
    local pair=$SENT_WIT3_PAIR split sets set s t src=() tgt=()
    s=$(sent_part tags "train.tags.$pair.$SENT_L1")
    t=$(sent_part tags "train.tags.$pair.$SENT_L2")
    sent_extract train --drop-empty --src "$s" --tgt "$t"
    for split in valid test; do
        src=()
        tgt=()
        sets=$SENT_WIT3_VALID
        [ "$split" = test ] && sets=$SENT_WIT3_TEST
        for set in $sets; do
            s=$(sent_part xml "IWSLT*.TED.$set.$pair.$SENT_L1.xml")
            t=$(sent_part xml "IWSLT*.TED.$set.$pair.$SENT_L2.xml")
            src+=(--src "$s")
            tgt+=(--tgt "$t")
        done
        sent_extract "$split" "${src[@]}" "${tgt[@]}"
    done
}

# The download step: SENT_FILES holds "NAME URL" lines (the step's arguments, so
# that its marker records them); each URL is fetched to download/NAME (once), then the .tgz/.tar.gz archives are extracted into raw/
# and other files copied to raw/NAME, all or nothing.
sent_download_files() {
    local line name url names=()
    for line in "${SENT_FILES[@]}"; do
        read -r name url <<< "$line"
        sent_fetch "$url" "$name"
        names+=("$name")
    done
    sent_unpack "${names[@]}"
}

# Plain parallel files, one sentence a line: SENT_PLAIN_TRAIN / _VALID / _TEST
# name the file stems (STEM.L1, STEM.L2, searched under the raw directory).
sent_text_plain() {
    local split stem s t
    for split in train valid test; do
        case $split in
            train) stem=$SENT_PLAIN_TRAIN ;;
            valid) stem=$SENT_PLAIN_VALID ;;
            test) stem=$SENT_PLAIN_TEST ;;
        esac
        s=$(sent_part plain "$stem.$SENT_L1")
        t=$(sent_part plain "$stem.$SENT_L2")
        if [ "$split" = train ]; then
            sent_extract "$split" --drop-empty --src "$s" --tgt "$t"
        else
            sent_extract "$split" --src "$s" --tgt "$t"
        fi
    done
}

# ------------------------------------------------------------------ hybrid paper

# The hybrid paper's training set-up (App. A.1), for recipes/wmt14_en_de and
# recipes/wat17_ja_en: Vaswani et al.'s base configuration (THUMT), label
# smoothing 0.1, L2 1e-7, Adam (0.9, 0.98, 1e-9), linear warm-up over 4000
# steps then inverse square root, dropout 0.1, ~25000 source + 25000 target
# tokens per batch (4096 x 6 here, one GPU). "Early-stopped to maximize the
# BLEU score on the development set": checkpoint_best.pt is the checkpoint
# with the best validation BLEU (fairseq's --eval-bleu at every validation,
# with the test beam and length penalty; BLEU of the tokenized hypotheses,
# BPE removed, against the tokenized references, case-sensitive). 100k updates
# is Vaswani et al.'s base schedule; beam 4 and length penalty 0.6 are theirs
# too (the paper gives none). Separate source/target dictionaries (bin-sep)
# and untied embeddings: THUMT's defaults (Table 1's 88.0M parameters).
SENT_HYB_GEN="--beam 4 --lenpen 0.6"
SENT_HYB_TRAIN="--optimizer adam --adam-betas (0.9,0.98) --adam-eps 1e-9 \
--lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7 \
--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1 --weight-decay 1e-7 \
--max-tokens 4096 --update-freq 6 --max-update 100000 \
--eval-bleu --eval-bleu-args {\"beam\":4,\"lenpen\":0.6} --eval-bleu-remove-bpe --eval-tokenized-bleu \
--best-checkpoint-metric bleu --maximize-best-checkpoint-metric"

# sent_hyb_group NAME: the hybrid set-up as training group NAME (on bin-sep).
sent_hyb_group() { sent_group "$1" bin-sep "$SENT_HYB_TRAIN" "$SENT_HYB_GEN"; }

# ------------------------------------------------------------------ DC paper, IWSLT

# The DC paper's IWSLT set-up (Sec. 5.2: 4+4 layers, d=256, 4 heads, shared
# BPE vocabulary; Sec. 5.3: Adam (0.9, 0.98, 1e-9), single-cycle cosine with
# warm-up, 2048-token batches, 200k iterations, beam 6, length penalty 1.1).
# What the paper leaves open (our choices, see the READMEs): warm-up 4000 and
# peak 1e-3, dropout 0.3, label smoothing 0.1, the FFN size 1024 (4d), tied
# embeddings, the checkpoint with the best validation loss.
sent_dc_iwslt_models() {
    sent_group dc-iwslt bin "--share-all-embeddings --optimizer adam --adam-betas (0.9,0.98) \
--adam-eps 1e-9 --lr-scheduler cosine --lr 1e-3 --warmup-updates 4000 --warmup-init-lr 1e-7 \
--min-lr 1e-9 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.3 \
--max-tokens 2048 --max-update 200000" "--beam 6 --lenpen 1.1"
    sent_model transformer Transformer dc-iwslt main "--arch transformer --encoder-layers 4 \
--decoder-layers 4 --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 \
--decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4"
    sent_model enc-dc Enc-DC dc-iwslt main "--arch transformer_dc_iwslt"
    sent_model dec-dc Dec-DC dc-iwslt main "--arch transformer_dc_iwslt_dec"
    sent_model full-dc Full-DC dc-iwslt main "--arch transformer_dc_iwslt_full"
    SENT_DEFAULT_MODELS="transformer enc-dc dec-dc full-dc"
}

# The DC paper's IWSLT recipes on WIT3's archives (recipes/iwslt14_es_en,
# iwslt14_ro_en, iwslt15_fr_en) differ only in these values, so their run.sh
# sets RECIPE_NAME, sources recipe.sh and calls
#   sent_dc_wit3_run SRC LANGUAGE YEAR MERGES "VALID SETS" "TEST SETS" "$@"
# SRC<->English (SRC the other language's code, LANGUAGE its name, for the
# usage), IWSLT's YEAR-01 release, MERGES the BPE merge operations (Sec. 5.1's
# shared vocabulary), the WIT3 validation and test sets (Sec. 5.1), then the
# recipe's command line (recipe_init). Scored as Sec. 5.1: case-sensitive BLEU
# with multi-bleu.perl (tokenized) besides sacreBLEU, casing preserved.
sent_dc_wit3_run() {
    local other=$1 language=$2 year=$3 archive
    # shellcheck disable=SC2034  # read by recipe_init
    RECIPE_USAGE="usage: bash recipes/$RECIPE_NAME/run.sh [--smoke] [--raw DIR] [--workdir DIR] [--cpu]
IWSLT${year#20} $language<->English with the DC paper's models (Table 2); see recipes/$RECIPE_NAME/README.md.
Environment: MODELS, DIRECTIONS, TRAIN_EXTRA, GEN_EXTRA, PYTHON."
    recipe_init "${@:7}"
    SENT_L1=$other
    SENT_L2=en
    SENT_DEFAULT_DIRECTIONS="$other-en en-$other"
    SENT_MERGES=$4
    SENT_WIT3_PAIR=$other-en
    archive=https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive/$year-01
    SENT_FILES=(
        "$other-en.tgz $archive/texts/$other/en/$other-en.tgz"
        "$other-en-test.tgz $archive-test/texts/$other/en/$other-en.tgz"
    )
    SENT_WIT3_VALID=$5
    SENT_WIT3_TEST=$6
    SENT_DOWNLOAD_FN=sent_download_files
    SENT_TEXT_FN=sent_text_wit3
    SENT_DETOK=1
    SENT_TOK_BLEU=1
    SENT_TOK_BLEU_LABEL="the paper's metric: case-sensitive multi-bleu.perl"
    SENT_PAPER="Ampomah et al. (2021), Dual contextual module for NMT: Table 2 (${other^}->En, En->${other^})."
    sent_dc_iwslt_run
}

# The whole IWSLT recipe after recipe_init: Table 2's models in both directions,
# BLEU by source length per direction (the paper shows it for En->De only,
# Fig. 5; here as an extra), the summary.
sent_dc_iwslt_run() {
    local dir
    sent_dc_iwslt_models
    sent_pipeline
    for dir in "${SENT_DIRS[@]}"; do
        step "by-length-$dir-$(IFS=+; printf '%s' "${SENT_MODELS[*]}")" sent_by_length "$dir" "${SENT_MODELS[@]}"
    done
    sent_summary
}
