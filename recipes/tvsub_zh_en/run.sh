#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# TVsub zh-en (Wang et al., AAAI 2018): Chinese-English TV-episode subtitles,
# each episode a document; the corpus Miculicich et al. (2018, HAN) report on
# as "Subtitles zh-en". One stage-1 sentence-level transformer, then every
# model at the same stage-2 budget; multi-reference BLEU as published,
# single-reference BLEU, document-level BLEU and the context's contribution
# (CXMI). See README.md here.
set -euo pipefail

RECIPE_NAME=tvsub_zh_en
RECIPE_USAGE="usage: recipes/tvsub_zh_en/run.sh [--workdir DIR] [--smoke | --study] [--raw DIR] [--cpu]

TVsub zh-en documents (one TV episode = one document): download (git clone)
or --raw, ctx_fairseq.prep.tvsub (episodes as documents, dev/test from
the SGML refsets, every reference kept, checked), joint subword-nmt BPE,
fairseq-preprocess with docids, stage 1 sentence-level transformer, stage 2
every model of MODELS from it at one budget, translation of the test set (when
the input has none: dev's second episode, the checkpoints chosen on its first;
printed), BLEU with every reference
(sacreBLEU --tokenize none, as published), BLEU with the first reference,
document-level BLEU, paired bootstrap p-values against the transformer
(sacreBLEU), CXMI against the empty context (Fernandes et al. 2021) with a
document-bootstrap interval, results.md/results.json.

  --workdir DIR  everything goes here        [work/tvsub_zh_en]
  --smoke        tiny models, a few updates, CPU (in DIR/smoke); the episodes of
                 --raw (the first SMOKE_EPISODES of them)
  --study        the CPU study (in DIR/study): a slice of episodes, a small shape,
                 stage-2 models at an equal target-token budget with a sampled
                 context size, held-out episodes as a context-evaluation split;
                 under two hours on one core (README.md, 'CPU study'); resumable
  (neither)      the GPU mode: the full corpus, Transformer base, --fp16 on CUDA
  --raw DIR      a clone of github.com/longyuewangdcu/tvsub or the extracted
                 archive (same layout) instead of cloning
  --cpu          train and translate on the CPU

Environment (defaults in README.md): MODELS, EPISODES (FIRST:END), BPE_MERGES,
MAX_TOKENS, SENT_UPDATES, DOC_UPDATES, DOC_TOKENS (stage-2 target-token budget:
updates per model from it), BEAM, SEED, TVSUB_URL, TVSUB_REF (a git revision),
DEV_SRC, TEST_SRC, EVAL_SPLIT (auto|test|dev-episodes|dev), CONTEXT_DROPOUT, COWORD_DROPOUT,
SAMPLE_CONTEXT (1: --sampled-context-size K), MEMORY_WINDOW (selective, with
SAMPLE_CONTEXT: windows 0..K on its memory), HELDOUT (FIRST:END held-out
episodes), HELDOUT_SENTS, UNTIL=data, D2D_MAX_TOKENS (the doc2doc rows' segments), TRAIN_EXTRA,
GEN_EXTRA, PYTHON.
(WORD_CAPACITY, selective's removed word-level capacity: an error.)"

# the settings given in the environment, before any default is filled in
_ENV_SETTINGS=(MODELS EPISODES SMOKE_EPISODES BPE_MERGES MAX_TOKENS GEN_MAX_TOKENS SENT_UPDATES
               DOC_UPDATES DOC_TOKENS BEAM SEED TVSUB_URL TVSUB_REF DEV_SRC TEST_SRC EVAL_SPLIT
               CONTEXT_DROPOUT COWORD_DROPOUT SAMPLE_CONTEXT MEMORY_WINDOW HELDOUT HELDOUT_SENTS
               WORD_CAPACITY TRAIN_EXTRA GEN_EXTRA UNTIL PYTHON OMP_NUM_THREADS D2D_MAX_TOKENS)
declare -A _ENV_GIVEN=()
for _v in "${_ENV_SETTINGS[@]}"; do
    if [ -n "${!_v+x}" ]; then _ENV_GIVEN[$_v]=${!_v}; fi
done

# --study is this recipe's own option; the rest are the shared ones
STUDY=0
_args=()
for _a in "$@"; do
    if [ "$_a" = --study ]; then STUDY=1; else _args+=("$_a"); fi
done
for _a in "${_args[@]}"; do
    if [ "$_a" = --smoke ] && [ "$STUDY" = 1 ]; then
        printf '[%s] error: --smoke and --study exclude each other\n' "$RECIPE_NAME" >&2
        exit 1
    fi
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/recipe.sh
. "$HERE/../lib/recipe.sh"
# selective's word-level capacity (--doc-word-capacity) is gone (issue 24): its
# word level is exact; a run that asks for one stops before anything is
# written (it would not get it)
case ${WORD_CAPACITY:-0} in
    0) ;;
    *) die "WORD_CAPACITY=$WORD_CAPACITY: selective's --doc-word-capacity was removed (issue 24); its word level is streamed and exact at every document length: unset WORD_CAPACITY" ;;
esac
if [ -n "${MEMORY_WINDOW:-}" ] && ! [[ "$MEMORY_WINDOW" =~ ^[1-9][0-9]*$ ]]; then
    die "MEMORY_WINDOW=$MEMORY_WINDOW: expected a number of sentences >= 1"
fi
recipe_init "${_args[@]}"
smoke_needs_raw
if [ "$STUDY" = 1 ]; then
    WORK="$WORK/study"
    mkdir -p "$WORK/.done" "$WORK/logs"
    log "study mode: work directory $WORK"
fi
MODE=gpu
[ "$SMOKE" = 1 ] && MODE=smoke
[ "$STUDY" = 1 ] && MODE=study
L1=zh
L2=en
TVSUB_URL=${TVSUB_URL:-https://github.com/longyuewangdcu/tvsub.git}
TVSUB_REF=${TVSUB_REF:-}
EVAL_SPLIT=${EVAL_SPLIT:-auto}
DEV_SRC=${DEV_SRC:-}
TEST_SRC=${TEST_SRC:-}
CONTEXT_DROPOUT=${CONTEXT_DROPOUT:-}
_coword_given=${COWORD_DROPOUT+1}  # COWORD_DROPOUT= (empty) turns the study's default off
COWORD_DROPOUT=${COWORD_DROPOUT:-}
_sample_given=${SAMPLE_CONTEXT+1}  # SAMPLE_CONTEXT= (empty) turns the study's default off
SAMPLE_CONTEXT=${SAMPLE_CONTEXT:-}
_window_given=${MEMORY_WINDOW+1}  # MEMORY_WINDOW= (empty): selective reads its whole memory
MEMORY_WINDOW=${MEMORY_WINDOW:-}
_tokens_given=${DOC_TOKENS+1}  # DOC_TOKENS= (empty): DOC_UPDATES updates per model
DOC_TOKENS=${DOC_TOKENS:-}
_heldout_given=${HELDOUT+1}  # HELDOUT= (empty): no held-out split
HELDOUT=${HELDOUT:-}
HELDOUT_SENTS=${HELDOUT_SENTS:-100}
SEED=${SEED:-1}

if [ "$SMOKE" = 1 ] || [ "$STUDY" = 1 ]; then
    # tiny models gain nothing from several threads, and a busy CPU slows
    # threaded runs down several times over (recipes/iwslt17_ted_en_de/README.md)
    if [ -z "${OMP_NUM_THREADS:-}" ]; then
        export OMP_NUM_THREADS=1
        log "$MODE mode: OMP_NUM_THREADS=1 (set OMP_NUM_THREADS to choose another number)"
    fi
fi

# ------------------------------------------------------------------ settings per mode
# Every model trains the same number of stage-2 updates of MAX_TOKENS tokens
# from the same stage-1 model (the equal budget): the transformer and
# transformer_concat go on from its weights (--finetune-from-model), the
# others load every stage-1 tensor into their own shape
# (--init-from-sentence-checkpoint; their new context or DC/hybrid
# parameters start from their initialisation).
case $MODE in
    smoke)
        EPISODES=${EPISODES:-0:${SMOKE_EPISODES:-12}}
        BPE_MERGES=${BPE_MERGES:-200}
        dim=32; ffn=64; heads=2; layers=2
        MAX_TOKENS=${MAX_TOKENS:-1000}
        SENT_UPDATES=${SENT_UPDATES:-40}
        DOC_UPDATES=${DOC_UPDATES:-6}
        SENT_LR=(--lr 1e-3 --lr-scheduler fixed)
        DOC_LR=(--lr 3e-4 --lr-scheduler fixed)
        BEAM=${BEAM:-1}
        GEN_LEN=(--max-len-a 1.2 --max-len-b 10)
        FP16=()
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-96}
        MODELS=${MODELS-transformer concat context_aware zhang2018 han han_enc selective dc hybrid} ;;
    study)
        # README.md, 'CPU study': sized by measurement to under two hours on one core
        # every episode of the 300 but the held-out ones: at this budget no sentence
        # is seen twice (README, 'Why the pronouns lose against the empty context')
        EPISODES=${EPISODES:-0:276}
        BPE_MERGES=${BPE_MERGES:-8000}
        dim=192; ffn=768; heads=4; layers=3
        MAX_TOKENS=${MAX_TOKENS:-2048}
        SENT_UPDATES=${SENT_UPDATES:-500}
        DOC_UPDATES=${DOC_UPDATES:-300}
        # every stage-2 model trains on the same number of target tokens (not updates)
        [ -n "$_tokens_given" ] || DOC_TOKENS=600000
        SENT_LR=(--lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 300 --warmup-init-lr 1e-7)
        # stage 2 goes on at the rate stage 1 ends with (7e-4 * sqrt(300 / 500))
        DOC_LR=(--lr 5e-4 --lr-scheduler fixed)
        # CoWord dropout (Fernandes et al. 2021) on every stage-2 model, the
        # transformer included (no confound): a word of the current sentence
        # dropped is to be found in the context, if the model has one
        [ -n "$_coword_given" ] || COWORD_DROPOUT=0.1
        # the sampled context size (Fernandes et al. 2021): the empty context of
        # CXMI is in distribution
        [ -n "$_sample_given" ] || SAMPLE_CONTEXT=1
        # selective's equivalent (docs/document_translation.md): a window of
        # 0..10 previous sentences on its memory, 10 at test time
        [ -n "$_window_given" ] || MEMORY_WINDOW=10
        # 24 training episodes never trained on, the first HELDOUT_SENTS sentences
        # each: the context-evaluation split (documents for a document bootstrap)
        [ -n "$_heldout_given" ] || HELDOUT=276:300
        BEAM=${BEAM:-1}
        GEN_LEN=(--max-len-a 1.2 --max-len-b 10)
        FP16=()
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-512}
        MODELS=${MODELS-transformer context_aware zhang2018 selective} ;;
    gpu)
        EPISODES=${EPISODES:-0:}
        BPE_MERGES=${BPE_MERGES:-30000}
        # Transformer base (Miculicich et al. 2018 use OpenNMT's base model)
        dim=512; ffn=2048; heads=8; layers=6
        MAX_TOKENS=${MAX_TOKENS:-4096}
        SENT_UPDATES=${SENT_UPDATES:-100000}
        DOC_UPDATES=${DOC_UPDATES:-20000}
        SENT_LR=(--lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 8000 --warmup-init-lr 1e-7)
        DOC_LR=(--lr 1e-4 --lr-scheduler fixed)
        BEAM=${BEAM:-4}
        GEN_LEN=()
        FP16=()
        if [ ${#CPU[@]} -eq 0 ]; then FP16=(--fp16); fi
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-512}
        MODELS=${MODELS-transformer concat context_aware zhang2018 han han_enc selective dc hybrid} ;;
esac
read -r -a MODEL_LIST <<< "$MODELS"
[ ${#MODEL_LIST[@]} -gt 0 ] || die "MODELS is empty: nothing to train after the stage-1 transformer"
if [ -n "$MEMORY_WINDOW" ] && [ -z "$SAMPLE_CONTEXT" ] && [ -n "$_window_given" ]; then
    die "MEMORY_WINDOW goes with SAMPLE_CONTEXT=1 (selective's windows are sampled 0..K)"
fi
# the prep step reads these: its marker records them
RECIPE_SETTINGS+=(EPISODES EVAL_SPLIT DEV_SRC TEST_SRC)

transformer_shape "$layers" "$dim" "$ffn" "$heads"
OPTIM=(--optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 1.0 --label-smoothing 0.1
       --seed "$SEED" --no-epoch-checkpoints --num-workers 0 --max-tokens "$MAX_TOKENS"
       --save-interval-updates "$([ "$MODE" = gpu ] && echo 2000 || echo 100)"
       --keep-interval-updates 1 --validate-interval-updates
       "$([ "$MODE" = gpu ] && echo 2000 || echo 100)" "${FP16[@]}")
# stage 1's options without the architecture and the budget
TVSUB_SENT_OPTS=("${SHAPE[@]}" --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1
           --criterion label_smoothed_cross_entropy "${OPTIM[@]}" "${SENT_LR[@]}")
SENT_TRAIN=(--arch transformer "${TVSUB_SENT_OPTS[@]}" --max-update "$SENT_UPDATES")
# (the number of updates: train_model, DOC_UPDATES or from DOC_TOKENS)
DOC_COMMON=("${SHAPE[@]}" --dropout 0.2 --attention-dropout 0.1 --activation-dropout 0.1
            "${OPTIM[@]}" "${DOC_LR[@]}")
GEN=(--max-tokens "${GEN_MAX_TOKENS:-8000}" --num-workers 0 "${GEN_LEN[@]}")

# tvsub_model_spec NAME -> M_ARCH, M_TASK (task options: training, generation,
# CXMI), M_MODEL (model options), M_INIT (init: init-from, finetune, scratch),
# M_GEN (generation only), M_ITER (1: iterative decoding, pass 1 by the stage-1
# model), M_CXMI (1: a context model, measured by ctx-cxmi, the document memory
# included; 0: sentence-level, nothing to measure), M_K (the bounded context
# size, for --sampled-context-size; 0: none), M_TRAIN (training only:
# CONTEXT_DROPOUT, COWORD_DROPOUT (every model: the sentence-level ones through
# the document task with no context) and SAMPLE_CONTEXT, Fernandes et al. 2021;
# generation, ctx-iterative-decode included, takes no such option).
tvsub_model_spec() {
    M_TASK=(--task document_translation); M_MODEL=(); M_GEN=(); M_ITER=0; M_CXMI=1
    M_INIT="init-from"; M_CRIT=(--criterion label_smoothed_cross_entropy_ctx)
    M_TRAIN=(); M_K=0; M_D2D=0
    case "$1" in
        doc2doc|doc2doc_mr|gtrans)
            # issue 39 (recipes/lib/steps_doc2doc.sh): segments of D2D_MAX_TOKENS, the
            # stage-1 transformer fine-tuned, translated with the sentence-count frame
            # and split back into sentences; no CoWord dropout or sampled context size
            # (the doc2doc task refuses them: G-Transformer has its word dropout)
            d2d_spec "$1" "$D2D_MAX_TOKENS"
            M_ARCH=$D2D_ARCH; M_TASK=("${D2D_TASK[@]}"); M_GEN=("${D2D_GEN[@]}")
            M_MODEL=("${D2D_MODEL[@]}"); M_INIT=finetune; M_D2D=1
            # --lr-scale-pretrained with --fp16: fairseq's flattened fp32 copy is one
            # group; one copy per parameter keeps the groups (ctx_fairseq/optim/lr_scale.py)
            if [ "$1" = gtrans ] && [ ${#FP16[@]} -gt 0 ]; then M_MODEL+=(--fp16-no-flatten-grads); fi
            M_CRIT=(--criterion label_smoothed_cross_entropy) ;;
        transformer)  # the stage-1 transformer trained on for the same budget
            M_ARCH=transformer; M_TASK=(--task translation); M_INIT=finetune; M_CXMI=0
            M_CRIT=(--criterion label_smoothed_cross_entropy)
            # CoWord dropout for it too: the document task without context
            if [ -n "$COWORD_DROPOUT" ]; then
                M_TASK=(--task document_translation --source-context-size 0)
            fi ;;
        concat)  # Tiedemann & Scherrer (2017) 2-to-2: one previous sentence on each side
            M_ARCH=transformer_concat; M_INIT=finetune
            M_TASK+=(--concat-context --source-context-size 1 --target-context-size 1)
            M_GEN=(--own-target-context); M_K=1 ;;
        context_aware)  # Voita et al. (2018): one previous source sentence
            M_ARCH=transformer_context_aware
            M_TASK+=(--source-context-size 1); M_K=1 ;;
        zhang2018)  # Zhang et al. (2018): two previous source sentences, in the encoder
            M_ARCH=transformer_doc_zhang2018
            M_TASK+=(--source-context-size 2); M_K=2
            M_MODEL=(--context-integration encoder --freeze-sentence-level) ;;
        han)  # Miculicich et al. (2018), HAN joint: 3 previous source and target sentences
            M_ARCH=transformer_han; M_ITER=1; M_K=3
            M_TASK+=(--source-context-size 3 --target-context-size 3) ;;
        han_enc)  # Miculicich et al. (2018), HAN encoder: 3 previous source sentences
            M_ARCH=transformer_han_enc; M_K=3
            M_TASK+=(--source-context-size 3) ;;
        selective)  # Maruf et al. (2019): encoder side, online (previous sentences), H-attention
            M_ARCH=transformer_selective_doc
            # --length-buckets 4: the batch's sentence-level layers run in 4 groups of
            # similar length (a document batch is padded to its longest sentence;
            # the same results to rounding, 1.2x the speed on the CPU)
            M_TASK+=(--document-context online --document-memory --memory-precomputed
                     --length-buckets 4)
            M_MODEL=(--doc-attention hierarchical --sentence-attn sparsemax --word-attn softmax
                     --context-memory frozen)
            # the sampled context size's equivalent for a memory: windows 0..K in
            # training (--sampled-context-size, below); translation, validation and
            # CXMI read window K (--memory-window: it goes with the task's options)
            if [ -n "$SAMPLE_CONTEXT" ] && [ -n "$MEMORY_WINDOW" ]; then
                M_K=$MEMORY_WINDOW
                M_TASK+=(--memory-window "$MEMORY_WINDOW")
            fi ;;
        dc)  # Xu et al.: sentence-level (local context) from the stage-1 weights
            # (--init-from-sentence-checkpoint is the document task's: no context)
            M_ARCH=transformer_dc; M_TASK+=(--source-context-size 0); M_CXMI=0
            M_CRIT=(--criterion label_smoothed_cross_entropy) ;;
        hybrid)  # Xu et al. (ACL 2019): sentence-level hybrid local/global, likewise
            M_ARCH=transformer_hybrid; M_TASK+=(--source-context-size 0); M_CXMI=0
            M_CRIT=(--criterion label_smoothed_cross_entropy) ;;
        *) die "MODELS: unknown model $1 (expected transformer, concat, context_aware, zhang2018, han, han_enc, selective, dc, hybrid, doc2doc, doc2doc_mr, gtrans)" ;;
    esac
    [ "$M_D2D" = 0 ] || return 0
    if [ "$M_CXMI" = 1 ]; then  # a context model: its training's dropouts (not generation's)
        if [ -n "$CONTEXT_DROPOUT" ]; then M_TRAIN+=(--context-dropout "$CONTEXT_DROPOUT"); fi
        if [ -n "$SAMPLE_CONTEXT" ] && [ "$M_K" -gt 0 ]; then  # (a memory: its windows)
            M_TRAIN+=(--sampled-context-size "$M_K")
        fi
    fi
    # CoWord dropout: every stage-2 model (the sentence-level ones too: no confound)
    if [ -n "$COWORD_DROPOUT" ]; then M_TRAIN+=(--coword-dropout "$COWORD_DROPOUT"); fi
}
for _m in "${MODEL_LIST[@]}"; do tvsub_model_spec "$_m"; done

# ------------------------------------------------------------------------------ data

# download URL [REF]: git clone (of REF) into $WORK/raw, whole or not at all
download() {
    local url=$1 ref=${2:-} part="$WORK/raw.part"
    command -v git > /dev/null || die "git is needed to clone $url"
    rm -rf "$part"
    if ! git clone --quiet ${ref:+--no-checkout} "$url" "$part"; then
        rm -rf "$part"
        die "cannot clone $url (no network?). Clone it by hand, or extract an archive of it, and give it with --raw DIR"
    fi
    if [ -n "$ref" ]; then
        git -C "$part" checkout --quiet "$ref" || { rm -rf "$part"; die "$url: no revision $ref"; }
    fi
    git -C "$part" rev-parse HEAD > "$part/.tvsub-revision"
    rm -rf "$WORK/raw"
    mv "$part" "$WORK/raw"
}

prep() {
    local raw=${RAW:-$WORK/raw} extra=()
    step_reads RAW
    [ -n "$DEV_SRC" ] && extra+=(--dev-src "$DEV_SRC")
    [ -n "$TEST_SRC" ] && extra+=(--test-src "$TEST_SRC")
    "$PY" -c 'import sys; from ctx_fairseq.prep.tvsub import main; main(sys.argv[1:])' \
        prep --raw "$raw" --out "$WORK/docs" --episodes "$EPISODES" --eval-split "$EVAL_SPLIT" \
        "${extra[@]}"
}

# binarize: one joined dictionary with <brk> (the concatenation baseline's
# break) in it from the start, so that every model, the stage-1 transformer
# included, has the same embedding tables and transformer_concat starts from
# the stage-1 checkpoint as it is.
binarize() {
    local bin="$WORK/data-bin" tmp="$WORK/dict.part"
    rm -rf "$tmp"
    fairseq-preprocess --source-lang "$L1" --target-lang "$L2" --trainpref "$WORK/bpe/train" \
        --destdir "$tmp" --joined-dictionary --dict-only --workers 2 > "$WORK/logs/dict.log" 2>&1 \
        || { tail -n 20 "$WORK/logs/dict.log" >&2; die "fairseq-preprocess --dict-only failed"; }
    grep -q '^<brk> ' "$tmp/dict.$L1.txt" || printf '<brk> 1 #fairseq:overwrite\n' >> "$tmp/dict.$L1.txt"
    preprocess "$L1" "$L2" "$WORK/bpe" "$bin" --srcdict "$tmp/dict.$L1.txt" --joined-dictionary
    rm -rf "$tmp"
}

# --------------------------------------------------------------------------- models

# record_command TOOL ARGS...: the exact command line of a model's training,
# translation or CXMI into $WORK/commands/NAME.TOOL.sh (NAME: the checkpoint
# directory of --save-dir or --path; $WORK written as such), for results.md;
# a step run again rewrites its file.
record_command() {
    local tool=$1 prev="" a dir="" name line
    for a in "$@"; do
        case $prev in
            --save-dir) dir=$a ;;
            --path) dir=$(dirname "$a") ;;
        esac
        prev=$a
    done
    [ -n "$dir" ] || return 0
    name=$(basename "$dir")
    # the held-out split's translation beside the test split's (not over it);
    # ctx-cxmi of cxmi_NAME keeps its name (the held-out split, or the test split without
    # HELDOUT), the test split's of cxmitest_NAME is .test; a contrastive run with shuffled
    # context is .shuffled
    case "$tool: $* " in
        ctx-cxmi:*"/cxmi_test "*) tool="$tool.test" ;;  # the test split's (cxmitest_NAME)
        ctx-cxmi:*) ;;
        ctx-score-contrastive:*" --context-ablation shuffled "*) tool="$tool.shuffled" ;;
        *" $WORK/data-heldout "*) tool="$tool.heldout" ;;
    esac
    mkdir -p "$WORK/commands"
    line=$(printf '%q ' "$@")
    # shellcheck disable=SC2016  # a literal $WORK
    line=${line//"$WORK"/'$WORK'}
    line=${line//"$REPO/"/}  # run from the repository's root
    printf '%s\n' "${line% }" > "$WORK/commands/$name.$tool.sh.part"
    mv "$WORK/commands/$name.$tool.sh.part" "$WORK/commands/$name.$tool.sh"
}
fairseq-generate() { record_command fairseq-generate "$@"; command fairseq-generate "$@"; }
ctx-iterative-decode() { record_command ctx-iterative-decode "$@"; command ctx-iterative-decode "$@"; }
ctx-cxmi() { record_command ctx-cxmi "$@"; command ctx-cxmi "$@"; }
fairseq-validate() { record_command fairseq-validate "$@"; command fairseq-validate "$@"; }
ctx-score-contrastive() { record_command ctx-score-contrastive "$@"; command ctx-score-contrastive "$@"; }

# fairseq-train's peak resident memory: the shared train() runs
# `fairseq-train`; this function measures it with GNU time into
# $WORK/logs/peak-NAME.kb (KB; the host memory of the process; a resumed
# training appends its own: report.py takes the largest).
fairseq-train() {
    local save="" prev="" a
    record_command fairseq-train "$@"
    for a in "$@"; do [ "$prev" = --save-dir ] && save=$a; prev=$a; done
    if [ -x /usr/bin/time ] && [ -n "$save" ]; then
        /usr/bin/time -a -f '%M' -o "$WORK/logs/peak-$(basename "$save").kb" fairseq-train "$@"
    else
        command fairseq-train "$@"
    fi
}

# train_model NAME INIT BUDGET ARGS...: stage 2 of NAME (INIT: init-from |
# finetune); BUDGET: `updates=N` (N updates) or `tokens=N`: the updates that
# train on N target tokens of the current sentences with these options
# (budget.py: the epoch-1 batches as fairseq-train builds them; the context
# counts in --max-tokens, so a context model gets more, smaller updates),
# recorded in results/NAME/budget.json
train_model() {
    local name=$1 init=$2 budget=$3 ckpt updates init_args=()
    shift 3
    ckpt=$(best_checkpoint "$WORK/checkpoints/sentence")
    case $init in
        init-from) init_args=(--init-from-sentence-checkpoint "$ckpt") ;;
        finetune) init_args=(--finetune-from-model "$ckpt") ;;
    esac
    case $budget in
        updates=*) updates=${budget#updates=} ;;
        tokens=*)
            mkdir -p "$WORK/results/$name"
            updates=$("$PY" "$HERE/budget.py" "${budget#tokens=}" "$WORK/results/$name/budget.json" \
                -- "$WORK/data-bin" --user-dir "$USER_DIR" "${init_args[@]}" "$@" "${CPU[@]}" \
                2> "$WORK/logs/budget-$name.log") \
                || { tail -n 20 "$WORK/logs/budget-$name.log" >&2; die "$name: budget.py failed"; }
            log "$name: $updates updates for ${budget#tokens=} target tokens ($(grep -o '"target_tokens_per_update": [0-9.]*' "$WORK/results/$name/budget.json"))" ;;
        *) die "train_model: BUDGET must be updates=N or tokens=N, got $budget" ;;
    esac
    train "$WORK/data-bin" "$WORK/checkpoints/$name" "${init_args[@]}" "$@" --max-update "$updates"
}

# tvsub_heldout: the held-out episodes HELDOUT (first HELDOUT_SENTS sentences of
# each; heldout.py checks they are not training episodes) as the split `test`
# of $WORK/data-heldout, binarized with the training dictionaries; the
# reference (the training target's units) is $WORK/docs/heldout.en
tvsub_heldout() {
    local raw=${RAW:-$WORK/raw} dest="$WORK/data-heldout" lang
    step_reads RAW
    "$PY" "$HERE/heldout.py" --raw "$raw" --episodes "$1" --train-episodes "$EPISODES" \
        --sentences "$2" --out "$WORK/docs"
    for lang in "$L1" "$L2"; do
        bpe_apply "$WORK/bpe/codes" "$WORK/docs/heldout.$lang" "$WORK/bpe/heldout.$lang"
    done
    rm -rf "$dest.part"
    fairseq-preprocess --source-lang "$L1" --target-lang "$L2" --testpref "$WORK/bpe/heldout" \
        --srcdict "$WORK/data-bin/dict.$L1.txt" --tgtdict "$WORK/data-bin/dict.$L2.txt" \
        --destdir "$dest.part" --workers 1 > "$WORK/logs/heldout-preprocess.log" 2>&1 \
        || { tail -n 20 "$WORK/logs/heldout-preprocess.log" >&2; die "fairseq-preprocess (held-out) failed"; }
    cp "$WORK/docs/heldout.docids" "$dest.part/test.docids"
    rm -rf "$dest"
    mv "$dest.part" "$dest"
}

# translate_heldout NAME ITER BEAM ARGS...: the held-out split to
# $WORK/generate/NAME.heldout.txt (as translate_model translates the test split)
translate_heldout() {
    local name=$1 iter=$2 beam=$3
    shift 3
    step_reads GEN_EXTRA
    if [ "$iter" = 1 ]; then
        ctx_iterative_translate "$name.heldout" "$WORK/data-heldout" "$WORK/checkpoints/$name" \
            "$WORK/checkpoints/sentence" test "$beam" "$@"
    else
        ctx_translate "$name.heldout" "$WORK/data-heldout" "$WORK/checkpoints/$name" test \
            --beam "$beam" "$@"
    fi
}

# score_heldout NAME: BLEU and d-BLEU of the held-out translation (one
# reference, the training target's units, --tokenize none) into results/NAME/heldout/
score_heldout() {
    local name=$1 out="$WORK/results/$1/heldout"
    mkdir -p "$out"
    ctx_logged "$out/bleu.log" bleu "$WORK/generate/$name.heldout.txt" "$WORK/docs/heldout.docids" \
        "$out" --refs "$WORK/docs/heldout.$L2" --hypotheses H --tokenize none --prefix bleu
}

# paired_model NAME: sacreBLEU's paired bootstrap of NAME against the
# transformer (ctx_fairseq.eval.scoring.significance), on the test split (every
# reference; its documents: a document-level p-value only with enough of
# them) into results/NAME/paired_test.json and, with HELDOUT, on the held-out
# split (sentences and documents) into results/NAME/paired_heldout.json
paired_model() {
    local name=$1 refs=()
    # shellcheck disable=SC2012  # the recipe's own file names
    mapfile -t refs < <(ls "$WORK/docs/"test.ref[0-9]*."$L2" | sort)
    ctx_logged "$WORK/results/$name/paired_test.log" "$PY" -m ctx_fairseq.eval.scoring.significance \
        --generate --baseline "$WORK/generate/transformer.txt" --system "$WORK/generate/$name.txt" \
        --refs "${refs[@]}" --docids "$WORK/docs/test.docids" --tokenize none \
        --out "$WORK/results/$name/paired_test.json"
    if [ -n "$HELDOUT" ]; then
        ctx_logged "$WORK/results/$name/paired_heldout.log" "$PY" -m ctx_fairseq.eval.scoring.significance \
            --generate --baseline "$WORK/generate/transformer.heldout.txt" \
            --system "$WORK/generate/$name.heldout.txt" --refs "$WORK/docs/heldout.$L2" \
            --docids "$WORK/docs/heldout.docids" --tokenize none \
            --out "$WORK/results/$name/paired_heldout.json"
    fi
}

# gate_model NAME ARGS...: the context gate of NAME's scored checkpoint on the
# dev set (valid), no masking (validation gets no dropout of any kind):
# fairseq-validate with the training criterion, whose validation line carries
# the model's gate statistics (ctx_mass: the share of the context) into
# results/NAME/gate.log (report.py reads it)
gate_model() {
    local name=$1 ckpt
    shift
    ckpt=$(best_checkpoint "$WORK/checkpoints/$name")
    ctx_logged "$WORK/results/$name/gate.log" fairseq-validate "$WORK/data-bin" --user-dir "$USER_DIR" \
        --path "$ckpt" --valid-subset valid --max-tokens "$MAX_TOKENS" --num-workers 0 \
        --log-format simple "${CPU[@]}" "$@"
}

# translate_model NAME ITER BEAM ARGS...: the test split to $WORK/generate/NAME.txt
translate_model() {
    local name=$1 iter=$2 beam=$3
    shift 3
    step_reads GEN_EXTRA  # read by ctx_iterative_translate and generate
    ctx_maruf_translate "$name" "$iter" "$beam" "$@"  # as the Maruf pipeline translates
}

# translate_d2d NAME BEAM ARGS... / translate_heldout_d2d NAME BEAM ARGS...: a doc2doc
# row's test (held-out) split on segments with the frame, split back into sentences
# (d2d_translate) to $WORK/generate/NAME.txt (NAME.heldout.txt), as translate_model
# and translate_heldout write them
translate_d2d() {
    local name=$1 beam=$2
    shift 2
    d2d_translate "$name" "$WORK/data-bin" "$WORK/checkpoints/$name" test --beam "$beam" "$@"
}
translate_heldout_d2d() {
    local name=$1 beam=$2
    shift 2
    d2d_translate "$name.heldout" "$WORK/data-heldout" "$WORK/checkpoints/$name" test \
        --beam "$beam" "$@"
}

# segbleu_model NAME MAP: the per-segment d-BLEU of NAME's test translation on MAP
# (the greedy segments at D2D_MAX_TOKENS; d2d_segment_bleu), against the first
# reference as doc_bleu (--tokenize none), into results/NAME/segment_bleu.*
segbleu_model() {
    d2d_segment_bleu "$1" "$2" "$WORK/docs/test.docids" segment_bleu \
        --refs "$WORK/docs/test.ref0.$L2" --hypotheses H --tokenize none
}

# score_model NAME: BLEU with every reference and the first (sentence and
# document level, prep_tvsub score) and ctx-doc-bleu's report (first reference)
score_model() {
    local name=$1 out="$WORK/results/$1"
    mkdir -p "$out"
    ctx_logged "$out/bleu.log" "$PY" -c 'import sys; from ctx_fairseq.prep.tvsub import main; main(sys.argv[1:])' \
        score "$WORK/generate/$name.txt" --refs "$WORK/docs/test.ref" --docids "$WORK/docs/test.docids" \
        --out-dir "$out" --prefix bleu
    ctx_logged "$out/doc_bleu.log" bleu "$WORK/generate/$name.txt" "$WORK/docs/test.docids" "$out" \
        --refs "$WORK/docs/test.ref0.$L2" --hypotheses H --tokenize none --prefix doc_bleu
    log "$name: $(grep -m1 '^BLEU (all' "$out/bleu.log")"
}

# cxmi_model NAME MAX_TOKENS: ctx-cxmi on the held-out split when there is
# one (HELDOUT): the true context against the empty context (the paper's
# CXMI, with a document-bootstrap interval), shuffled beside it (a
# sensitivity check), the curve over context sizes 0..K, P-CXMI by word class;
# without HELDOUT, on the test split as the Maruf pipeline measures it
# (ctx_maruf_cxmi: against shuffled; a test split of one document is recorded
# as such, not measured)
cxmi_model() {
    # shellcheck disable=SC2034  # read by ctx_maruf_cxmi (--lang)
    local CTX_TGT=$L2 name=$1 max_tokens=$2 extra=(--curve)
    if [ -z "$HELDOUT" ]; then ctx_maruf_cxmi "$@"; return; fi
    [ "$M_K" -gt 0 ] || extra=()  # a document memory: no context size to vary
    ctx_logged "$WORK/results/$name/cxmi.log" ctx-cxmi --path "$(best_checkpoint "$WORK/checkpoints/$name")" \
        --data "$WORK/data-heldout" --split test --out "$WORK/results/$name/cxmi" \
        --conditions none,shuffled --max-tokens "$max_tokens" --lang "$L2" --cpu "${extra[@]}"
}

# ---------------------------------------------------------------- dropped pronouns
# (issue 38; the steps after every other, additive: the +DP source of the test
# split, docs/test.dp.zh, written by prep where the input has one)

# tvsub_refs: the test split's references, one a line, in order
tvsub_refs() { printf '%s\n' "$WORK/docs/"test.ref[0-9]*."$L2" | sort; }

# provenance_model NAME: the scored checkpoint (best_checkpoint), its update
# number, its validation loss and the split it was chosen on (prep.json) into
# results/NAME/checkpoint.json (report.py checkpoint)
provenance_model() {
    local name=$1
    mkdir -p "$WORK/results/$name"
    atomic "$WORK/results/$name/checkpoint.json" "$PY" "$HERE/report.py" checkpoint "$WORK" \
        "$(best_checkpoint "$WORK/checkpoints/$name")"
}

# dp_model NAME: ctx-dp-eval of NAME's test translation against the +DP
# source (recall of the restored pronouns, pronoun precision, intervals over
# sentences) into results/NAME/dp.json and dp.log
dp_model() {
    local name=$1 refs=()
    mapfile -t refs < <(tvsub_refs)
    ctx_logged "$WORK/results/$name/dp.log" ctx-dp-eval --source "$WORK/docs/test.zh" \
        --dp-source "$WORK/docs/test.dp.zh" --refs "${refs[@]}" --hyp "$WORK/generate/$name.txt" \
        --json "$WORK/results/$name/dp.json"
}

# dp_paired_model NAME: ctx-dp-eval of the transformer (A) against NAME (B):
# McNemar on the items and the paired bootstrap of recall, into
# results/NAME/dp_paired.json
dp_paired_model() {
    local name=$1 refs=()
    mapfile -t refs < <(tvsub_refs)
    ctx_logged "$WORK/results/$name/dp_paired.log" ctx-dp-eval --source "$WORK/docs/test.zh" \
        --dp-source "$WORK/docs/test.dp.zh" --refs "${refs[@]}" \
        --hyp "$WORK/generate/transformer.txt" --hyp-b "$WORK/generate/$name.txt" \
        --json "$WORK/results/$name/dp_paired.json"
}

# dp_suite_build: the contrastive suite of the dropped pronouns (ctx-dp-suite
# build) on the test split, records in the toy format (lines of data-bin's
# test split, their documents named) into results/dp_suite.jsonl
dp_suite_build() {
    local refs=()
    mapfile -t refs < <(tvsub_refs)
    ctx_logged "$WORK/results/dp_suite.log" ctx-dp-suite build --source "$WORK/docs/test.zh" \
        --dp-source "$WORK/docs/test.dp.zh" --refs "${refs[@]}" \
        --docids "$WORK/docs/test.docids" --out "$WORK/results/dp_suite.jsonl"
}

# dp_score_model NAME CONTEXT: NAME's best checkpoint on the suite
# (ctx-score-contrastive --format toy; the suite's words are the published
# units, so the scorer applies the recipe's BPE: --bpe subword_nmt --bpe-codes
# bpe/codes, --tokenizer none), with its context and, CONTEXT 1, with
# shuffled context (another document position's); ctx-dp-suite report of the
# runs into results/NAME/dp_suite/report.json
dp_score_model() {
    local name=$1 context=$2 ckpt out="$WORK/results/$1/dp_suite" scores=() runs=(true) extra
    shift 2
    extra=("$@")  # --gold-target-context: concat, the doc2doc rows (their target holds the context)
    ckpt=$(best_checkpoint "$WORK/checkpoints/$name")
    cuda_args
    mkdir -p "$out"
    # shuffled context is another document's: a test split of one document
    # (dev-SUB02) has none to give, so it is not measured there (the report
    # shows -), as cxmi_test_model does
    if [ "$context" != 0 ]; then
        if [ "$(ctx_count_docs "$WORK/data-bin/test.docids")" -ge 2 ]; then
            runs+=(shuffled)
        else
            log "$name: the test split has one document: no shuffled context to score the suite with"
        fi
    fi
    for run in "${runs[@]}"; do
        local ablation=()
        [ "$run" = true ] || ablation=(--context-ablation "$run")
        ctx_logged "$out/$run.log" ctx-score-contrastive --path "$ckpt" \
            --data "$WORK/data-bin" --contrastive "$WORK/results/dp_suite.jsonl" --format toy \
            --split test --tokenizer none --bpe subword_nmt --bpe-codes "$WORK/bpe/codes" \
            --max-tokens "$MAX_TOKENS" --out-dir "$out" --name "$run" "${ablation[@]}" \
            "${extra[@]}" "${CUDA_ARGS[@]}"
        scores+=("$out/contrastive_$run.json")
    done
    ctx_logged "$out/report.log" ctx-dp-suite report --suite "$WORK/results/dp_suite.jsonl" \
        --scores "${scores[@]}" --json "$out/report.json"
}

# cxmi_test_model NAME MAX_TOKENS: ctx-cxmi on the test split (the +DP
# source's sentences: report.py takes the P-CXMI of the English pronouns of
# the sentences with a restored pronoun from tokens.jsonl), against the empty
# context, and shuffled where the split has two documents or more, into
# results/NAME/cxmi_test/
cxmi_test_model() {
    local name=$1 max_tokens=$2 ckpt conditions=none dev=(--cpu)
    ckpt=$(best_checkpoint "$WORK/checkpoints/$name")
    [ "$(ctx_count_docs "$WORK/data-bin/test.docids")" -lt 2 ] || conditions=none,shuffled
    cuda_args
    [ ${#CUDA_ARGS[@]} -eq 0 ] || dev=()
    ctx_logged "$WORK/results/$name/cxmi_test.log" ctx-cxmi --path "$ckpt" \
        --data "$WORK/data-bin" --split test --out "$WORK/results/$name/cxmi_test" \
        --conditions "$conditions" --max-tokens "$max_tokens" --lang "$L2" "${dev[@]}"
}

# report: results.md and results.json (every model of this run with results)
report() {
    ctx_write_if_changed "$WORK/results/results.json" "$PY" "$HERE/report.py" json "$WORK" "$MODE" \
        sentence "${MODEL_LIST[@]}"
    ctx_write_if_changed "$WORK/results/results.md" "$PY" "$HERE/report.py" md "$WORK" "$MODE" \
        sentence "${MODEL_LIST[@]}"
}

# -------------------------------------------------------------------------- steps

# this run's command line with the settings given in the environment (results.md)
mkdir -p "$WORK/commands"
{
    for _v in "${_ENV_SETTINGS[@]}"; do
        if [ -n "${_ENV_GIVEN[$_v]+x}" ]; then printf '%s=%q ' "$_v" "${_ENV_GIVEN[$_v]}"; fi
    done
    printf 'recipes/tvsub_zh_en/run.sh'
    printf ' %q' "$@"
    printf '\n'
} > "$WORK/commands/run.sh.part"
mv "$WORK/commands/run.sh.part" "$WORK/commands/run.sh"
if [ -z "$RAW" ]; then step download download "$TVSUB_URL" "$TVSUB_REF"; fi
step prep prep
"$PY" - "$WORK/docs/prep.json" <<'PYEOF'
import json, sys
from ctx_fairseq.prep.tvsub import eval_split_note
s = json.load(open(sys.argv[1], encoding="utf-8"))
t = s["test"]
print(f"[tvsub_zh_en] {eval_split_note(s)}: {t['sentences']} sentences, "
      f"{t['references']} reference(s)", file=sys.stderr)
PYEOF
# joint subword-nmt BPE over the published units (no re-tokenization)
step bpe ctx_bpe_joint "$BPE_MERGES" "$L1" "$L2" "$WORK/docs" "$WORK/bpe"
step binarize binarize
if [ -n "$HELDOUT" ]; then step heldout tvsub_heldout "$HELDOUT" "$HELDOUT_SENTS"; fi
if [ "${UNTIL:-}" = data ]; then
    log "UNTIL=data: the data are ready in $WORK/data-bin; stopping before training"
    exit 0
fi
log "models: transformer (stage 1) then ${MODEL_LIST[*]} ($MODE mode)"
step train_sentence train "$WORK/data-bin" "$WORK/checkpoints/sentence" "${SENT_TRAIN[@]}"
step translate_sentence translate_model sentence 0 "$BEAM" --task translation "${GEN[@]}"
step score_sentence score_model sentence
if [ -n "$HELDOUT" ]; then
    step translate_heldout_sentence translate_heldout sentence 0 "$BEAM" --task translation "${GEN[@]}"
    step score_heldout_sentence score_heldout sentence
fi
BUDGET="updates=$DOC_UPDATES"
[ -z "$DOC_TOKENS" ] || BUDGET="tokens=$DOC_TOKENS"
# each model trained, translated, scored and measured before the next: a run
# stopped midway has every result of the models it finished (WORK/results/NAME)
for m in "${MODEL_LIST[@]}"; do
    tvsub_model_spec "$m"
    step "train_$m" train_model "$m" "$M_INIT" "$BUDGET" --arch "$M_ARCH" "${M_TASK[@]}" \
        "${M_TRAIN[@]}" "${M_MODEL[@]}" "${M_CRIT[@]}" "${DOC_COMMON[@]}"
    if [ "$M_D2D" = 1 ]; then
        step "translate_$m" translate_d2d "$m" "$BEAM" "${M_TASK[@]}" "${M_GEN[@]}" "${GEN[@]}"
    else
        step "translate_$m" translate_model "$m" "$M_ITER" "$BEAM" "${M_TASK[@]}" "${M_GEN[@]}" "${GEN[@]}"
    fi
    step "score_$m" score_model "$m"
    if [ -n "$HELDOUT" ]; then
        if [ "$M_D2D" = 1 ]; then
            step "translate_heldout_$m" translate_heldout_d2d "$m" "$BEAM" "${M_TASK[@]}" \
                "${M_GEN[@]}" "${GEN[@]}"
        else
            step "translate_heldout_$m" translate_heldout "$m" "$M_ITER" "$BEAM" "${M_TASK[@]}" \
                "${M_GEN[@]}" "${GEN[@]}"
        fi
        step "score_heldout_$m" score_heldout "$m"
    fi
    if [ "$M_CXMI" = 1 ]; then
        step "cxmi_$m" cxmi_model "$m" "$MAX_TOKENS"
        # (a doc2doc row has no context gate to read)
        [ "$M_D2D" = 1 ] || step "gate_$m" gate_model "$m" "${M_TASK[@]}"
    fi
done
# issue 39: the per-segment d-BLEU of every model on one map (only in a run with a
# doc2doc row: the other runs' steps and results are unchanged)
if d2d_any "${MODEL_LIST[@]}"; then
    step "segmap_$D2D_MAX_TOKENS" d2d_segment_map "$WORK/data-bin" test "$D2D_MAX_TOKENS" \
        "$WORK/segments/test.$D2D_MAX_TOKENS.segments"
    for m in sentence "${MODEL_LIST[@]}"; do
        step "segbleu_$m" segbleu_model "$m" "$WORK/segments/test.$D2D_MAX_TOKENS.segments"
    done
    if [[ " ${MODEL_LIST[*]} " == *" transformer "* ]]; then
        for m in sentence "${MODEL_LIST[@]}"; do
            [ "$m" = transformer ] || step "pairedseg_$m" d2d_paired_segments "$m" transformer \
                "$WORK/segments/test.$D2D_MAX_TOKENS.segments" "$WORK/docs/test.docids" \
                "$WORK/docs/test.ref0.$L2"
        done
    fi
fi
# BLEU against the transformer (the sentence-level model of the same stage-2
# budget), paired bootstrap, for every other model
if [[ " ${MODEL_LIST[*]} " == *" transformer "* ]]; then
    for m in sentence "${MODEL_LIST[@]}"; do
        [ "$m" = transformer ] || step "paired_$m" paired_model "$m"
    done
else
    log "no transformer in MODELS: no paired p-values (they are against the transformer)"
fi
# the dropped pronouns (issue 38), after every step above (additive: a finished
# run gains these on a re-run): where each result's checkpoint comes from, then,
# with the test split's +DP source, DP recall and pronoun precision, the
# contrastive suite with and without the true context, P-CXMI on the test split,
# and the paired DP comparison against the transformer
for m in sentence "${MODEL_LIST[@]}"; do
    step "provenance_$m" provenance_model "$m"
done
if [ -e "$WORK/docs/test.dp.zh" ]; then
    step dpsuite dp_suite_build
    for m in sentence "${MODEL_LIST[@]}"; do
        M_CXMI=0; M_D2D=0
        [ "$m" = sentence ] || tvsub_model_spec "$m"
        step "dp_$m" dp_model "$m"
        # a model whose target holds its context's translations scores the suite with
        # the references as that context (an oracle), as its CXMI does
        gold=()
        if [ "$m" = concat ] || [ "$M_D2D" = 1 ]; then gold=(--gold-target-context); fi
        step "dpscore_$m" dp_score_model "$m" "$M_CXMI" "${gold[@]}"
        if [ "$M_CXMI" = 1 ]; then step "cxmitest_$m" cxmi_test_model "$m" "$MAX_TOKENS"; fi
    done
    if [[ " ${MODEL_LIST[*]} " == *" transformer "* ]]; then
        for m in sentence "${MODEL_LIST[@]}"; do
            [ "$m" = transformer ] || step "dppaired_$m" dp_paired_model "$m"
        done
    fi
else
    log "no $WORK/docs/test.dp.zh (the input has no +DP source for the test split): the dropped-pronoun steps (dp_*, dpsuite, dpscore_*, cxmitest_*, dppaired_*) are skipped"
fi
report
log "done: $WORK/results/results.md"
cat "$WORK/results/results.md"
