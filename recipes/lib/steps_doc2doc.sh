# shellcheck shell=bash
# Documents as the unit of translation (issue 39): the rows doc2doc greedy,
# multi-resolution doc2doc and G-Transformer, shared by the document recipes
# (recipes/tvsub_zh_en and the Maruf et al. pipeline of recipes/lib/steps_context.sh:
# IWSLT17 TED, News Commentary v11, Europarl v7). Sourced by recipes/lib/recipe.sh.
#
# The models (names a recipe's model list takes):
#   doc2doc     Junczys-Dowmunt (2019): greedy segments of consecutive sentences of
#               at most D2D_MAX_TOKENS tokens (--doc2doc greedy), the recipe's
#               sentence-level transformer fine-tuned on them
#   doc2doc_mr  Sun et al. (2022): multi-resolution training (--doc2doc multires:
#               every document in 1, 2, 4, ... chunks; chunks over the limit split
#               greedily), likewise fine-tuned; validation and test on greedy segments
#   gtrans      Bao et al. (2021), G-Transformer (--arch transformer_gtrans, the
#               recipe's shape): stage 2 from the sentence model, its loaded
#               parameters at 0.2x the learning rate (--lr-scale-pretrained 0.2, the
#               paper's), its global attentions and gates new; word dropout 0.1 (the
#               authors' fine-tuning script); 2 global layers (the paper's)
# Every one starts from the recipe's stage-1 transformer (--finetune-from-model: its
# dictionaries lack <sep>, whose rows the task appends on load), trains with the
# recipe's stage-2 options, translates the test split on greedy segments with the
# sentence-count frame (--doc2doc-frame: the output has the source's number of
# sentences, so s-BLEU exists), and ctx-doc2doc-split maps the output back to one
# entry per sentence id: $WORK/generate/NAME.txt is then read by the recipe's
# scoring steps exactly as a sentence-level model's (BLEU, d-BLEU, paired
# bootstrap, pronoun suites, CXMI).
#
# The per-segment d-BLEU (G-Transformer's d-BLEU) of EVERY model of a run that has
# one of these rows: ctx-doc-bleu --segments on one map, the greedy segments of the
# test split at D2D_MAX_TOKENS ($WORK/segments/test.segments, d2d_segment_map); a
# doc2doc model's own map (ctx-doc2doc-split's NAME.txt.segments) is checked to be it.
#
# Settings: D2D_MAX_TOKENS (--doc2doc-max-tokens; a recipe's default), D2D_LR_SCALE
# [0.2], D2D_WORD_DROPOUT [0.1], D2D_GLOBAL_LAYERS [2].

D2D_ALL_MODELS=(doc2doc doc2doc_mr gtrans)

# d2d_is_model NAME: is NAME one of the doc2doc rows?
d2d_is_model() {
    local m
    for m in "${D2D_ALL_MODELS[@]}"; do [ "$m" = "$1" ] && return 0; done
    return 1
}

# d2d_any MODEL...: is any of the MODELs a doc2doc row?
d2d_any() {
    local m
    for m in "$@"; do d2d_is_model "$m" && return 0; done
    return 1
}

# d2d_spec NAME MAX_TOKENS: the row's options ->
#   D2D_ARCH   --arch value (transformer, or transformer_gtrans)
#   D2D_TASK   task options (training, generation, scoring, CXMI)
#   D2D_MODEL  model and optimiser options of stage 2 (training only)
#   D2D_GEN    generation only (the sentence-count frame)
# shellcheck disable=SC2034  # the D2D_* arrays are read by the callers
d2d_spec() {
    local name=$1 max=$2 mode=greedy
    [ "$name" = doc2doc_mr ] && mode=multires
    d2d_is_model "$name" || die "d2d_spec: $name is not a doc2doc model (${D2D_ALL_MODELS[*]})"
    [[ "$max" =~ ^[1-9][0-9]*$ ]] || die "D2D_MAX_TOKENS=$max: expected a number of tokens"
    D2D_ARCH=transformer
    D2D_TASK=(--task document_translation --doc2doc "$mode" --doc2doc-max-tokens "$max"
              --source-context-size 0)
    D2D_MODEL=()
    D2D_GEN=(--doc2doc-frame)
    if [ "$name" = gtrans ]; then
        D2D_ARCH=transformer_gtrans
        D2D_MODEL=(--gtrans-global-layers "${D2D_GLOBAL_LAYERS:-2}"
                   --word-dropout "${D2D_WORD_DROPOUT:-0.1}"
                   --lr-scale-pretrained "${D2D_LR_SCALE:-0.2}")
    fi
}

# d2d_arch_label NAME: the row's architecture as the tables name it.
d2d_arch_label() {
    case $1 in
        doc2doc) printf 'transformer, doc2doc greedy segments (Junczys-Dowmunt 2019)\n' ;;
        doc2doc_mr) printf 'transformer, multi-resolution doc2doc (Sun et al. 2022), fine-tuned from the sentence model (theirs: from scratch)\n' ;;
        gtrans) printf 'transformer_gtrans, G-Transformer from the sentence model (Bao et al. 2021)\n' ;;
    esac
}

# d2d_translate NAME DATA SAVE_DIR SPLIT ARGS...: fairseq-generate of SAVE_DIR's best
# checkpoint on the segments of SPLIT (ARGS: the task options, --doc2doc-frame, the
# beam...) with --remove-bpe to $WORK/generate/NAME.segments.txt (log:
# $WORK/logs/generate-NAME.log), then ctx-doc2doc-split to $WORK/generate/NAME.txt
# (one entry per sentence id) with NAME.txt.segments beside it; its report (segments,
# mismatches) in $WORK/results/NAME/doc2doc_split.json. A hypothesis with another
# number of sentences than its source (impossible with the frame) stops the step,
# naming the segments.
d2d_translate() {
    local name=$1 data=$2 ckpt=$3 split=$4 log out="$WORK/generate/$1"
    shift 4
    ckpt=$(best_checkpoint "$ckpt")
    log="$WORK/logs/generate-$name.log"
    mkdir -p "$WORK/generate" "$WORK/results/$name"
    if ! generate "$data" "$ckpt" "$split" "$out.segments.txt" --remove-bpe "$@" 2> "$log"; then
        tail -n 30 "$log" >&2
        die "fairseq-generate ($name, segments) failed; its log: $log"
    fi
    # (written where the later steps read them, so that the report names them; a
    # failed or killed split leaves no marker and the step writes them again)
    rm -f "$out.txt" "$out.txt.segments"
    if ! ctx-doc2doc-split "$out.segments.txt" --data "$data" --split "$split" --path "$ckpt" \
            --output "$out.txt" --report "$WORK/results/$name/doc2doc_split.json" \
            >> "$log" 2>&1; then
        rm -f "$out.txt" "$out.txt.segments"
        tail -n 5 "$log" >&2
        die "ctx-doc2doc-split ($name) failed (mismatched sentence counts are listed in $WORK/results/$name/doc2doc_split.json); its log: $log"
    fi
}

# d2d_segment_map DATA SPLIT MAX_TOKENS OUT: the greedy segments of SPLIT at
# MAX_TOKENS as the task plans them (ctx_fairseq.data.segments.plan_segments on the
# binaries' sizes and SPLIT.docids), one line of sentence ids per segment: the map
# of every model's per-segment d-BLEU (ctx-doc-bleu --segments).
d2d_segment_map() {
    mkdir -p "$(dirname "$4")"
    atomic "$4" "$PY" -c '
import sys
import numpy as np
from fairseq.data import data_utils
from ctx_fairseq.cli.doc2doc_split import language_pair
from ctx_fairseq.data.docids import read_docids
from ctx_fairseq.data.segments import plan_segments
data, split, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
src, tgt = language_pair(data, split)
def sizes(lang):
    ds = data_utils.load_indexed_dataset(f"{data}/{split}.{src}-{tgt}.{lang}", None)
    return np.array(ds.sizes, dtype=np.int64, copy=True)
s, t = sizes(src), sizes(tgt)
plan = plan_segments(s, t, read_docids(f"{data}/{split}.docids", expected=len(s)), "greedy",
                     max_tokens)
for i in range(len(plan)):
    print(" ".join(str(int(j)) for j in plan.sentence_ids(i)))
' "$1" "$2" "$3"
}

# d2d_segment_bleu NAME MAP DOCIDS PREFIX CTX-DOC-BLEU-ARGS...: BLEU per sentence,
# per document and per segment of MAP (ctx-doc-bleu --segments) of
# $WORK/generate/NAME.txt (or the file given by --gen FILE first in the arguments)
# into $WORK/results/NAME/PREFIX.{md,json,png} and PREFIX.log. A doc2doc model's own
# segment map must be MAP (the same plan).
d2d_segment_bleu() {
    local name=$1 map=$2 docids=$3 prefix=$4 gen out="$WORK/results/$1"
    shift 4
    gen="$WORK/generate/$name.txt"
    if [ "${1:-}" = --gen ]; then gen=$2; shift 2; fi
    if [ -e "$WORK/generate/$name.txt.segments" ] && ! cmp -s "$WORK/generate/$name.txt.segments" "$map"; then
        die "$name: its segments ($WORK/generate/$name.txt.segments) are not those of $map: was it trained with another --doc2doc-max-tokens than D2D_MAX_TOKENS?"
    fi
    mkdir -p "$out"
    ctx_logged "$out/$prefix.log" bleu "$gen" "$docids" "$out" --segments "$map" --prefix "$prefix" "$@"
}

# d2d_paired_segments NAME BASELINE MAP DOCIDS REFS...: sacreBLEU's paired bootstrap
# (ctx-paired-bleu, ctx_fairseq.eval.scoring.significance) of NAME's tokenized BLEU
# ($WORK/generate/NAME.txt, H- lines, --tokenize none) against BASELINE's over the
# segments of MAP (each segment one unit: the per-segment d-BLEU), with its tests
# over sentences and documents, into $WORK/results/NAME/paired_segments.json
d2d_paired_segments() {
    local name=$1 base=$2 map=$3 docids=$4
    shift 4
    mkdir -p "$WORK/results/$name"
    ctx_logged "$WORK/results/$name/paired_segments.log" "$PY" -m ctx_fairseq.eval.scoring.significance \
        --generate --baseline "$WORK/generate/$base.txt" --system "$WORK/generate/$name.txt" \
        --refs "$@" --docids "$docids" --segments "$map" --tokenize none \
        --out "$WORK/results/$name/paired_segments.json"
}

# ------------------------------------------------------------------ the Maruf et al. pipeline
# (recipes/lib/steps_context.sh: ctx_maruf_pipeline runs these for concat and the doc2doc rows)

# ctx_maruf_finetune NAME TRAIN_ARGS...: stage 2 of NAME as fairseq's fine-tuning
# of the stage-1 transformer's best checkpoint (--finetune-from-model: every
# parameter loaded, a new optimiser; for the doc2doc rows the <sep> rows appended on
# load, G-Transformer's new attentions and gates from their initialisation).
ctx_maruf_finetune() {
    local name=$1 init
    shift
    init=$(best_checkpoint "$WORK/checkpoints/sentence")
    train "$WORK/data-bin" "$WORK/checkpoints/$name" --finetune-from-model "$init" "$@"
}

# ctx_maruf_segment_bleu NAME MAP TOK_REFS RAW_REFS: the per-segment d-BLEU of
# NAME's translation on MAP (d2d_segment_bleu), tokenized BLEU (H- lines against
# TOK_REFS, --tokenize none) into results/NAME/tokenized_bleu_segments.* and
# sacreBLEU (the detruecased, detokenized D- lines of ctx_bleu_report against
# RAW_REFS) into results/NAME/sacrebleu_segments.*
ctx_maruf_segment_bleu() {
    local name=$1 map=$2 docids="$WORK/data-bin/test.docids"
    d2d_segment_bleu "$name" "$map" "$docids" tokenized_bleu_segments --refs "$3" --hypotheses H \
        --tokenize none
    d2d_segment_bleu "$name" "$map" "$docids" sacrebleu_segments --gen "$WORK/generate/$name.detok.txt" \
        --refs "$4" --hypotheses D
}

# d2d_maruf_table MODEL=LABEL...: with a doc2doc row among the results,
# results/doc2doc.md and .json: every model's s-BLEU, d-BLEU per document and per
# segment (tokenized and sacreBLEU), pronoun accuracy and paired p in one table
# (recipes/lib/doc2doc_table.py); none without a per-segment result.
d2d_maruf_table() {
    local m found=0
    for m in "$WORK"/results/*/tokenized_bleu_segments.json; do [ -e "$m" ] && found=1; done
    [ "$found" = 1 ] || return 0
    ctx_write_if_changed "$WORK/results/doc2doc.md" "$PY" "$RECIPE_LIB_DIR/doc2doc_table.py" md \
        "$WORK/results" "$@"
    ctx_write_if_changed "$WORK/results/doc2doc.json" "$PY" "$RECIPE_LIB_DIR/doc2doc_table.py" json \
        "$WORK/results" "$@"
    log "issue 39 table: $WORK/results/doc2doc.md"
}
