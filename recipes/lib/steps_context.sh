# shellcheck shell=bash
# Shared steps of the document-level corpus recipes (News Commentary v11 and
# Europarl v7 for Maruf et al. 2019, OpenSubtitles2018 for Voita et al. 2018).
# Sourced by recipes/lib/recipe.sh (which sources every recipes/lib/steps_*.sh);
# uses its variables (WORK, SMOKE, PY, USER_DIR, CPU) and functions (atomic,
# moses_tok, truecase_train, truecase, bpe_learn, bpe_apply, preprocess, train,
# generate, bleu, best_checkpoint, die, log).
#
# Every data directory these steps read or write holds the three splits
# {train,valid,test}.{SRC,TGT} plus {split}.docids (one document id per line,
# the file the document_translation task reads): each step keeps the lines
# aligned and checks it (ctx_check_splits).

CTX_SPLITS=(train valid test)

# ctx_prep_corpora ARGS...: the document readers of ctx_fairseq.prep.corpora
# (the ctx-prep-corpora command, see docs/prep_corpora.md).
ctx_prep_corpora() {
    "$PY" -c 'import sys
from ctx_fairseq.prep.corpora import cli_main
cli_main(sys.argv[1:])' "$@"
}

# ctx_need FILE_OR_DIR WHAT: stop with a message naming what is missing.
ctx_need() {
    [ -e "$1" ] || die "$1: not found ($2)"
}

# ctx_lines FILE: number of lines.
ctx_lines() { wc -l < "$1" | tr -d ' '; }

# ctx_logged LOG COMMAND...: COMMAND's standard output and error to LOG; on
# failure the end of LOG is shown and the status returned.
ctx_logged() {
    local log=$1 rc=0
    shift
    mkdir -p "$(dirname "$log")"
    "$@" > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 30 "$log" >&2
        printf '[%s] %s failed (exit %s); its output: %s\n' "${RECIPE_NAME:-recipe}" "$1" "$rc" "$log" >&2
    fi
    return "$rc"
}

# ctx_check_splits DIR SRC TGT: DIR/{train,valid,test}.{SRC,TGT,docids} exist,
# are not empty and have one line per sentence each.
ctx_check_splits() {
    local dir=$1 src=$2 tgt=$3 split n f
    for split in "${CTX_SPLITS[@]}"; do
        for f in "$dir/$split.$src" "$dir/$split.$tgt" "$dir/$split.docids"; do
            [ -s "$f" ] || die "$f: missing or empty"
        done
        n=$(ctx_lines "$dir/$split.$src")
        for f in "$dir/$split.$tgt" "$dir/$split.docids"; do
            [ "$(ctx_lines "$f")" = "$n" ] || die "$f: $(ctx_lines "$f") lines, but $dir/$split.$src has $n; expected one line per sentence"
        done
    done
}

# ctx_copy_docids IN OUT: the docids of every split, unchanged.
ctx_copy_docids() {
    local split
    mkdir -p "$2"
    for split in "${CTX_SPLITS[@]}"; do cp "$1/$split.docids" "$2/$split.docids"; done
}

# ctx_moses_truecase SRC TGT IN OUT: Moses tokenisation (sacremoses, no escaping)
# of every split, then truecasing with one model per language learnt on the
# tokenized training text (Maruf et al. 2019, Sec. 4.1: "tokenised and
# truecased using the Moses toolkit"). OUT/truecase-model.{SRC,TGT} are kept.
ctx_moses_truecase() {
    local src=$1 tgt=$2 in=$3 out=$4 split lang
    mkdir -p "$out/tok"
    for lang in "$src" "$tgt"; do
        for split in "${CTX_SPLITS[@]}"; do
            moses_tok "$lang" "$in/$split.$lang" "$out/tok/$split.$lang"
        done
        truecase_train "$out/truecase-model.$lang" "$out/tok/train.$lang"
        for split in "${CTX_SPLITS[@]}"; do
            truecase "$out/truecase-model.$lang" "$out/tok/$split.$lang" "$out/$split.$lang"
        done
    done
    rm -rf "$out/tok"
    ctx_copy_docids "$in" "$out"
    ctx_check_splits "$out" "$src" "$tgt"
}

# ctx_bpe_joint MERGES SRC TGT IN OUT: one subword-nmt model learnt on both
# languages' training text (OUT/codes), applied to every split.
ctx_bpe_joint() {
    local merges=$1 src=$2 tgt=$3 in=$4 out=$5 split lang
    mkdir -p "$out"
    bpe_learn "$merges" "$out/codes" "$in/train.$src" "$in/train.$tgt"
    for lang in "$src" "$tgt"; do
        for split in "${CTX_SPLITS[@]}"; do
            bpe_apply "$out/codes" "$in/$split.$lang" "$out/$split.$lang"
        done
    done
    ctx_copy_docids "$in" "$out"
    ctx_check_splits "$out" "$src" "$tgt"
}

# ctx_bpe_separate MERGES SRC TGT IN OUT: one subword-nmt model per language
# (OUT/codes.SRC, OUT/codes.TGT), each learnt on that language's training text.
ctx_bpe_separate() {
    local merges=$1 src=$2 tgt=$3 in=$4 out=$5 split lang
    mkdir -p "$out"
    for lang in "$src" "$tgt"; do
        bpe_learn "$merges" "$out/codes.$lang" "$in/train.$lang"
        for split in "${CTX_SPLITS[@]}"; do
            bpe_apply "$out/codes.$lang" "$in/$split.$lang" "$out/$split.$lang"
        done
    done
    ctx_copy_docids "$in" "$out"
    ctx_check_splits "$out" "$src" "$tgt"
}

# ctx_train_sentence DATA SAVE ARGS...: stage 1, a sentence-level model.
ctx_train_sentence() { train "$@"; }

# ctx_train_document DATA SAVE STAGE1_SAVE ARGS...: stage 2, the document-level
# model initialised from stage 1's best checkpoint (--init-from-sentence-checkpoint:
# every parameter of the same name and shape is copied, the context parameters
# start fresh; see docs/transformer_context_aware.md, docs/transformer_selective_doc.md).
ctx_train_document() {
    local data=$1 save=$2 stage1=$3 init
    shift 3
    init=$(best_checkpoint "$stage1")
    train "$data" "$save" --init-from-sentence-checkpoint "$init" "$@"
}

# ctx_translate NAME DATA SAVE_DIR SPLIT ARGS...: fairseq-generate of SAVE_DIR's
# best checkpoint with --remove-bpe to $WORK/generate/NAME.txt; its log (with
# the decoding speed) goes to $WORK/logs/generate-NAME.log.
ctx_translate() {
    local name=$1 data=$2 ckpt=$3 split=$4 log
    shift 4
    ckpt=$(best_checkpoint "$ckpt")
    log="$WORK/logs/generate-$name.log"
    mkdir -p "$WORK/generate"
    if ! generate "$data" "$ckpt" "$split" "$WORK/generate/$name.txt" --remove-bpe "$@" 2> "$log"; then
        tail -n 30 "$log" >&2
        die "fairseq-generate ($name) failed; its log: $log"
    fi
}

# ctx_iterative_translate NAME DATA SAVE_DIR FIRST_PASS_SAVE_DIR SPLIT BEAM
# GENERATE_ARGS...: two-pass iterative decoding (ctx-iterative-decode; Maruf et
# al. 2019, Sec. 2.2: pass 1 by the sentence-level model, pass 2 by the document
# model with the other sentences' pass-1 translations as target context) to
# $WORK/generate/NAME.txt (GENERATE_ARGS and GEN_EXTRA go to every fairseq-generate pass).
ctx_iterative_translate() {
    local name=$1 data=$2 ckpt=$3 first=$4 split=$5 beam=$6 log extra=()
    shift 6
    ckpt=$(best_checkpoint "$ckpt")
    first=$(best_checkpoint "$first")
    log="$WORK/logs/generate-$name.log"
    read -r -a extra <<< "${GEN_EXTRA:-}"
    mkdir -p "$WORK/generate"
    if ! atomic "$WORK/generate/$name.txt" ctx-iterative-decode "$data" --path "$ckpt" \
            --first-pass-path "$first" --out-dir "$WORK/generate/$name.passes" \
            --gen-subset "$split" --beam "$beam" -- --remove-bpe "${CPU[@]}" "$@" "${extra[@]}" \
            2> "$log"; then
        tail -n 30 "$log" >&2
        die "ctx-iterative-decode ($name) failed; its log: $log"
    fi
}

# ctx_bleu_report NAME DOCIDS TOK_REFS RAW_REFS LANG [--detruecase]: the BLEU of
# $WORK/generate/NAME.txt at the sentence and the document level (ctx-doc-bleu,
# with sacreBLEU's signature), into $WORK/results/NAME/:
#   tokenized_bleu.*  the H- lines (tokenized, BPE removed) against TOK_REFS (the
#                     same tokenization, before BPE), sacreBLEU --tokenize none:
#                     the papers' "BLEU on tokenised text" (labelled so);
#   sacrebleu.*       the hypotheses detruecased (--detruecase) and detokenized
#                     by sacremoses against RAW_REFS (the original text), 13a.
ctx_bleu_report() {
    local name=$1 docids=$2 tok_refs=$3 raw_refs=$4 lang=$5 out
    shift 5
    out="$WORK/results/$name"
    mkdir -p "$out"
    ctx_logged "$out/tokenized_bleu.log" bleu "$WORK/generate/$name.txt" "$docids" "$out" \
        --refs "$tok_refs" --hypotheses H --tokenize none --prefix tokenized_bleu
    ctx_logged "$WORK/logs/postprocess-$name.log" ctx_prep_corpora postprocess-generate \
        "$WORK/generate/$name.txt" --out "$WORK/generate/$name.detok.txt" --lang "$lang" "$@"
    ctx_logged "$out/sacrebleu.log" bleu "$WORK/generate/$name.detok.txt" "$docids" "$out" \
        --refs "$raw_refs" --hypotheses D --prefix sacrebleu
    log "$name: tokenized $(grep -m1 '^sentence-level BLEU' "$out/tokenized_bleu.log"); sacreBLEU $(grep -m1 '^sentence-level BLEU' "$out/sacrebleu.log")"
}

# ctx_context_aware_analyses NAME DATA SAVE_DIR BEAM TOK_REFS [GENERATE_ARGS]:
# Voita et al. (2018)'s analyses of a transformer_context_aware checkpoint on
# the test split (ctx-context-aware-analysis) into $WORK/results/NAME/: BLEU with
# true vs shuffled context (and the tokenized BLEU of both outputs with
# signatures, ctx-doc-bleu), attention to context per source token (top-10) and
# the mean gate.
ctx_context_aware_analyses() {
    local name=$1 data=$2 ckpt=$3 beam=$4 tok_refs=$5 gen_args=${6:-} out ctx
    ckpt=$(best_checkpoint "$ckpt")
    out="$WORK/results/$name"
    mkdir -p "$out"
    ctx_logged "$out/bleu.log" ctx-context-aware-analysis bleu --path "$ckpt" --data "$data" \
        --split test --out-dir "$out" --beam "$beam" \
        --generate-args "--remove-bpe $gen_args ${GEN_EXTRA:-}"
    for ctx in none shuffled; do
        ctx_logged "$out/tokenized_bleu_context_$ctx.log" bleu "$out/generate-test-$ctx.txt" \
            "$data/test.docids" "$out" --refs "$tok_refs" --hypotheses H --tokenize none \
            --prefix "tokenized_bleu_context_$ctx"
    done
    ctx_logged "$out/attention.log" ctx-context-aware-analysis attention --path "$ckpt" \
        --data "$data" --split test --out-dir "$out"
}

# ctx_contrastive_suite NAME DATA SAVE_DIR SUITE LABEL [ARGS...]: contrastive
# accuracy (ctx-score-contrastive) of SAVE_DIR's best checkpoint with the context
# it was trained with (a sentence-level checkpoint: without context) into
# $WORK/results/NAME/contrastive_LABEL.{md,json,png} and LABEL.log; ARGS e.g.
# --format voita, --context-ablation shuffled.
ctx_contrastive_suite() {
    local name=$1 data=$2 ckpt=$3 suite=$4 label=$5 out
    shift 5
    ckpt=$(best_checkpoint "$ckpt")
    out="$WORK/results/$name"
    mkdir -p "$out"
    ctx_logged "$out/$label.log" ctx-score-contrastive --path "$ckpt" --data "$data" \
        --contrastive "$suite" --out-dir "$out" --name "$label" "$@"
}

# ctx_first_lines_with_context DOCIDS N: the first N corpus lines (0-based)
# that are not the first sentence of their document (they have context).
ctx_first_lines_with_context() {
    awk -v n="$2" '{ if (NR > 1 && $1 == prev && k < n) { print NR - 1; k++ } prev = $1 }' "$1"
}

# ctx_selective_analyses NAME DATA SAVE_DIR N: Maruf et al. (2019)'s analyses of
# a transformer_selective_doc checkpoint on the test split (ctx-selective-analysis)
# into $WORK/results/NAME/: sentence- and word-level sparsemax support and the
# gate over the split, and for the first N sentences with context the context
# sentences and words their heads attend to (the paper's Tables 6-7).
ctx_selective_analyses() {
    local name=$1 data=$2 ckpt=$3 n=$4 out line
    ckpt=$(best_checkpoint "$ckpt")
    out="$WORK/results/$name"
    mkdir -p "$out"
    ctx_logged "$out/support.log" ctx-selective-analysis support --path "$ckpt" --data "$data" \
        --split test --out-dir "$out"
    for line in $(ctx_first_lines_with_context "$data/test.docids" "$n"); do
        mkdir -p "$out/line$line"
        ctx_logged "$out/line$line/sentence.log" ctx-selective-analysis sentence --path "$ckpt" \
            --data "$data" --split test --line "$line" --out-dir "$out/line$line"
    done
}

# _ctx_complexity_text LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR...: Maruf et
# al. (2019)'s Table 5 for each model (ctx_fairseq.eval.scoring.recipe_report
# complexity): parameters (counted in SAVE_DIR's best checkpoint, without the
# frozen copy of the stage-1 model that --context-memory frozen keeps for the
# memory), those trained in stage 2, training and decoding speed. Speeds
# depend on the machine and the batch sizes: compare models of one run only.
_ctx_complexity_text() {
    "$PY" -m ctx_fairseq.eval.scoring.recipe_report complexity "$@"
}

# --------------------------------------------------------------------------
# Document data for the Maruf et al. recipes (IWSLT17 TED talks, News
# Commentary v11, Europarl v7): release archives and the IWSLT XML sets.

# ctx_check_md5 FILE MD5: an error unless FILE has that MD5 sum (MD5 empty:
# not checked, and said so). A mismatch removes FILE (re-run to download it again).
ctx_check_md5() {
    local file=$1 want=$2 got
    if [ -z "$want" ]; then
        log "md5 of $file not checked (no checksum given)"
        return 0
    fi
    got=$(md5sum "$file" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        rm -f "$file"
        die "$file: md5 $got, expected $want (a different or damaged file; removed). Re-run to download it again"
    fi
}

# ctx_extract_archive ARCHIVE DIR: a .tgz/.tar.gz or .zip archive into DIR.
ctx_extract_archive() {
    local archive=$1 dir=$2
    mkdir -p "$dir"
    case "$archive" in
        *.tgz|*.tar.gz) tar -xzf "$archive" -C "$dir" ;;
        *.zip) "$PY" -m zipfile -e "$archive" "$dir" ;;
        *) die "$archive: unknown archive type (expected .tgz, .tar.gz or .zip)" ;;
    esac
}

# ctx_count_docs DOCIDS: the number of documents (contiguous runs of one id).
ctx_count_docs() { uniq "$1" | wc -l | tr -d ' '; }

# ctx_cxmi_skipped DIR DOCS: DIR/cxmi.json for a test split of DOCS < 2 documents, where
# ctx-cxmi refuses the shuffled condition (no other document to take context from): the
# document count and no measurement, which the results tables report as n/a
ctx_cxmi_skipped() {
    mkdir -p "$1"
    printf '{"documents": %d, "shuffled": null, "skipped": "the test split has %d document(s): shuffled context needs another document"}\n' "$2" "$2" > "$1/cxmi.json.part"
    mv "$1/cxmi.json.part" "$1/cxmi.json"
}

# ctx_prep_xml_sets OUT_PREFIX L1 L2 N SRC_XML TGT_XML [SRC_XML TGT_XML ...]:
# several IWSLT-style XML pairs as one split (OUT_PREFIX.{L1,L2,docids}), in
# the order given (N > 0: only their first N documents). Each pair is
# validated as by `ctx-prep-docs xml`; a document id in two pairs, or fewer
# than N documents, is an error. One process for all pairs
# (ctx_fairseq.prep.recipe_text xml-sets).
ctx_prep_xml_sets() {
    local out=$1 l1=$2 l2=$3 n=$4
    shift 4
    { [ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ]; } || die "ctx_prep_xml_sets: expected SRC_XML TGT_XML pairs"
    mkdir -p "$(dirname "$out")"
    "$PY" -m ctx_fairseq.prep.recipe_text xml-sets "$out" "$l1" "$l2" "$n" "$@"
}

# ctx_check_disjoint DIR: no document id in two of DIR/{train,valid,test}.docids.
ctx_check_disjoint() {
    local dup
    dup=$(for s in "${CTX_SPLITS[@]}"; do uniq "$1/$s.docids" | sort -u; done | sort | uniq -d | head -n 3)
    [ -z "$dup" ] || die "$1: documents in more than one split: $(echo "$dup" | tr '\n' ' ')"
}

# ctx_pronoun_suite SRC TGT DOCIDS CODES OUT: the contrastive it -> er/sie/es/ihn
# suite of a split in its binarized units (ctx-make-pronoun-suite: an error
# when no line fits its heuristic).
ctx_pronoun_suite() {
    mkdir -p "$(dirname "$5")"
    "$PY" -m ctx_fairseq.eval.scoring.make_pronoun_suite --src "$1" --tgt "$2" --docids "$3" \
        --bpe-codes "$4" --out "$5"
}

# ctx_write_if_changed OUT COMMAND...: COMMAND's output to OUT, complete or not
# at all (COMMAND runs with set -e: any failing command in it fails it); OUT is
# left untouched (same time stamp) when the content is the same.
ctx_write_if_changed() {
    local out=$1 rc
    shift
    mkdir -p "$(dirname "$out")"
    set +e
    (set -e; "$@") > "$out.part"
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        rm -f "$out.part"
        die "writing $out failed (exit $rc)"
    fi
    if cmp -s "$out.part" "$out"; then rm -f "$out.part"; else mv "$out.part" "$out"; fi
}

# ctx_results_table FORMAT MODEL=LABEL...: every model's scores in one table,
# FORMAT md (markdown, with the signatures) or json (the same values, unrounded:
# {"columns": [...], "models": {MODEL: {...}}, "signatures": {...}}), from
# $WORK/results/MODEL/{tokenized_bleu,sacrebleu}.json, paired.json (ctx_paired:
# the p column), contrastive_{pronouns,contrapro}.json where a model has them,
# and cxmi/cxmi.json (ctx_maruf_cxmi:
# CXMI against shuffled context, nats per target token); LABEL: the
# architecture and notes. The model `sentence` (sentence-level, no context to
# remove) has "-" for CXMI; a context model without cxmi.json (an earlier
# version's results) "not measured"; a test split of one document "n/a" (no
# other document for the shuffled context: the dataset would take it from the
# same document, or, for a document memory, keep the document's own memory and
# give exactly 0, which is not a measurement). ctx_fairseq.eval.scoring.recipe_report
# results-table.
ctx_results_table() {
    "$PY" -m ctx_fairseq.eval.scoring.recipe_report results-table "$WORK/results" "$@"
}

# ctx_summary OUT [HEADER_FILE]: HEADER_FILE (e.g. a table), then every BLEU
# and contrastive result of $WORK/results (the lines ctx-doc-bleu and
# ctx-score-contrastive printed), in one file; rewritten only when it changes.
ctx_summary() {
    local out=$1 header=${2:-}
    ctx_write_if_changed "$out" _ctx_summary_text "$header"
}
_ctx_summary_text() {
    local f
    local mode='full run'
    if [ "$SMOKE" = 1 ]; then mode='smoke run: tiny model, meaningless numbers'
    elif [ "${MARUF_STUDY:-0}" = 1 ]; then mode='CPU study: a small model at a CPU budget (see the recipe README)'
    fi
    printf '# %s results (%s)\n\n' "$RECIPE_NAME" "$mode"
    if [ -n "$1" ]; then cat "$1"; printf '\n'; fi
    for f in "$WORK"/results/*/*.log; do
        [ -e "$f" ] || continue
        printf '## %s\n\n```\n' "${f#"$WORK"/results/}"
        grep -E '^(sentence|document)-level BLEU|^  BLEU =|signature|^overall:|^\||^(d-)?BLEU baseline' "$f" | grep -v '^|---' \
            | head -n 40 || true
        printf '```\n\n'
    done
}

# --------------------------------------------------------------------------
# Maruf, Martins & Haffari (NAACL 2019): the pipeline after the document data
# exist ($WORK/docs/{train,valid,test}.{SRC,TGT,docids}), shared by the
# IWSLT17 TED, News Commentary v11 and Europarl v7 recipes. The hyper-parameter
# table citing the paper is in each recipe's README. Settings (environment):
#   VARIANTS     selective-attention models, each INTEGRATION-DOC_CONTEXT-ATTENTION:
#                INTEGRATION encoder (monolingual context) | decoder (bilingual),
#                DOC_CONTEXT offline (past and future) | online (past only),
#                ATTENTION sentence | word (flat attention) | sparse-soft |
#                sparse-sparse (hierarchical attention). Empty: none. Default:
#                the recipe's DEFAULT_VARIANTS [encoder-offline-sparse-soft];
#                INTEGRATION [encoder], DOC_CONTEXT [offline], VARIANT
#                [sparse-soft] name one model instead of VARIANTS.
#   BASELINES    context-aware baselines, any of context_aware (Voita et al.
#                2018), zhang2018_enc, zhang2018_dec (Zhang et al. 2018, context
#                in the encoder / decoder; zhang2018: both), han_enc, han (HAN
#                encoder, HAN joint: Miculicich et al. 2018; han trains han_enc
#                first); issue 39 (recipes/lib/steps_doc2doc.sh): concat
#                (transformer_concat 2-to-2), doc2doc, doc2doc_mr, gtrans, each
#                fine-tuned from stage 1 [smoke: context_aware; full: context_aware
#                zhang2018 han; study: doc2doc doc2doc_mr gtrans concat]
#   D2D_MAX_TOKENS  the doc2doc rows' --doc2doc-max-tokens [512; smoke 128]
#   BPE_MERGES [30000], MAX_TOKENS [4096], GEN_MAX_TOKENS [8000], SEED [1], BEAM [1]
#   CONTRAPRO    ContraPro's contrapro.json (Table 4), converted beside it by its
#                json2text_and_context.pl -c 3: every online model is also scored on it
#   UNTIL=data   stop after the data steps (binarized data, pronoun suite)
#   Markers record each step's arguments, into which the model's options are
#   spelt out, so a changed setting stops a re-run rather than reusing outputs.
# Every model trains and reports under its own name (results/NAME); the data,
# the sentence-level model and its results are shared by all, so a later run
# with more VARIANTS or BASELINES adds models and keeps the finished ones.
# --smoke: a tiny model and a few updates; a recipe can set SMOKE_DIM [32],
# SMOKE_SENT_UPDATES [4], SMOKE_DOC_UPDATES [4], SMOKE_SENT_LR [1e-4],
# SMOKE_BPE_MERGES [60], SMOKE_MAX_TOKENS [2000] before calling the pipeline.
# MARUF_STUDY=1 (a recipe's --study): the CPU study's small shape and fixed
# updates, STUDY_DIM [192], STUDY_LAYERS [3], STUDY_SENT_UPDATES [600],
# STUDY_DOC_UPDATES [200], STUDY_SENT_LR [7e-4, inverse square root after 300
# warm-up updates], STUDY_DOC_LR [5e-4], STUDY_BPE_MERGES [8000], MAX_TOKENS [2048].

# ctx_maruf_config: the settings above as arrays (SENT_TRAIN, DOC_COMMON, GEN, ...).
ctx_maruf_config() {
    SEED=${SEED:-1}
    BEAM=${BEAM:-1}
    local dim ffn heads layers
    if [ "$SMOKE" = 1 ]; then
        BPE_MERGES=${BPE_MERGES:-${SMOKE_BPE_MERGES:-60}}
        dim=${SMOKE_DIM:-32}; ffn=$((2 * dim)); heads=2; layers=2
        SENT_LIMIT=(--max-update "${SMOKE_SENT_UPDATES:-4}")
        DOC_LIMIT=(--max-update "${SMOKE_DOC_UPDATES:-4}")
        SENT_LR=${SMOKE_SENT_LR:-1e-4}
        MAX_TOKENS=${MAX_TOKENS:-${SMOKE_MAX_TOKENS:-2000}}
        # a tiny model's hypotheses can run on to the length limit: keep it short
        GEN_LEN=(--max-len-a 1.2 --max-len-b 10)
        N_ANALYSED=${N_ANALYSED:-1}
        BASELINES=${BASELINES-context_aware}
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-128}
    elif [ "${MARUF_STUDY:-0}" = 1 ]; then
        # the CPU study (a recipe sets MARUF_STUDY=1, e.g. recipes/iwslt17_ted_en_de --study):
        # a small shape and a fixed number of updates (not the paper's epochs), stage 1
        # warmed up and decayed, stage 2 at the rate it ends with
        BPE_MERGES=${BPE_MERGES:-${STUDY_BPE_MERGES:-8000}}
        dim=${STUDY_DIM:-192}; ffn=$((4 * dim)); heads=4; layers=${STUDY_LAYERS:-3}
        SENT_LIMIT=(--max-update "${STUDY_SENT_UPDATES:-600}" --lr-scheduler inverse_sqrt
                    --warmup-updates 300 --warmup-init-lr 1e-7)
        DOC_LIMIT=(--max-update "${STUDY_DOC_UPDATES:-200}")
        SENT_LR=${STUDY_SENT_LR:-7e-4}
        # 7e-4 * sqrt(300 / 600): the rate stage 1 ends with
        DOC_LR=${STUDY_DOC_LR:-5e-4}
        MAX_TOKENS=${MAX_TOKENS:-2048}
        GEN_LEN=(--max-len-a 1.2 --max-len-b 10)
        N_ANALYSED=${N_ANALYSED:-1}
        BASELINES=${BASELINES-doc2doc doc2doc_mr gtrans concat}
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-512}
    else
        BPE_MERGES=${BPE_MERGES:-30000}
        # Sec. 4.1: 4 layers, hidden 512, feed-forward 2048, 8 heads
        dim=512; ffn=2048; heads=8; layers=4
        # "early stopping" (Sec. 4.1); the authors' released commands: -e 35 --patience 10
        SENT_LIMIT=(--max-epoch 35 --patience 10)
        DOC_LIMIT=(--max-epoch 35 --patience 10)
        SENT_LR=1e-4
        MAX_TOKENS=${MAX_TOKENS:-4096}
        GEN_LEN=()
        N_ANALYSED=${N_ANALYSED:-5}
        BASELINES=${BASELINES-context_aware zhang2018 han}
        D2D_MAX_TOKENS=${D2D_MAX_TOKENS:-512}
    fi
    DOC_LR=${DOC_LR:-1e-4}
    transformer_shape "$layers" "$dim" "$ffn" "$heads"
    # the default Adam, initial learning rate 1e-4 (kept), label smoothing 0.1 (Sec. 4.1)
    OPTIM=(--optimizer adam --adam-betas "(0.9, 0.999)" --lr-scheduler fixed
           --label-smoothing 0.1 --seed "$SEED" --no-epoch-checkpoints --num-workers 0
           --max-tokens "$MAX_TOKENS")
    # dropout of all four kinds: 0.1 sentence-level, 0.2 context-aware (Sec. 4.1)
    SENT_TRAIN=(--arch transformer "${SHAPE[@]}" --dropout 0.1 --attention-dropout 0.1
                --activation-dropout 0.1 --criterion label_smoothed_cross_entropy "${OPTIM[@]}"
                --lr "$SENT_LR" "${SENT_LIMIT[@]}")
    DOC_COMMON=("${SHAPE[@]}" --dropout 0.2 --attention-dropout 0.2 --activation-dropout 0.2
                --criterion label_smoothed_cross_entropy_ctx "${OPTIM[@]}" --lr "$DOC_LR"
                "${DOC_LIMIT[@]}")
    GEN=(--max-tokens "${GEN_MAX_TOKENS:-8000}" --num-workers 0 "${GEN_LEN[@]}")

    local v variants
    if [ -n "${INTEGRATION+x}${DOC_CONTEXT+x}${VARIANT+x}" ]; then
        # one variant named by its parts
        [ -z "${VARIANTS+x}" ] || die "VARIANTS and INTEGRATION/DOC_CONTEXT/VARIANT are both set: give the models in VARIANTS only"
        variants="${INTEGRATION:-encoder}-${DOC_CONTEXT:-offline}-${VARIANT:-sparse-soft}"
    else
        variants=${VARIANTS-${DEFAULT_VARIANTS:-encoder-offline-sparse-soft}}
    fi
    read -r -a VARIANT_LIST <<< "$variants"
    read -r -a BASELINE_LIST <<< "$BASELINES"
    [ "${#VARIANT_LIST[@]}" -gt 0 ] || [ "${#BASELINE_LIST[@]}" -gt 0 ] ||
        die "VARIANTS and BASELINES are both empty: nothing to train after the sentence-level model"
    # the models in training order (han starts from han_enc)
    DOC_MODELS=()
    for v in "${BASELINE_LIST[@]}"; do
        case "$v" in
            context_aware|zhang2018_enc|zhang2018_dec|han_enc) _ctx_add_model "$v" ;;
            zhang2018) _ctx_add_model zhang2018_enc; _ctx_add_model zhang2018_dec ;;
            han) _ctx_add_model han_enc; _ctx_add_model han ;;
            concat|doc2doc|doc2doc_mr|gtrans) _ctx_add_model "$v" ;;
            *) die "BASELINES: $v: expected context_aware, zhang2018 (both of zhang2018_enc, zhang2018_dec), han_enc, han, concat, doc2doc, doc2doc_mr or gtrans" ;;
        esac
    done
    for v in "${VARIANT_LIST[@]}"; do
        ctx_model_spec "$v"  # checks the name
        _ctx_add_model "$v"
    done
}
_ctx_add_model() {
    local m
    for m in "${DOC_MODELS[@]}"; do [ "$m" != "$1" ] || return 0; done
    DOC_MODELS+=("$1")
}

# ctx_model_spec NAME: a document-level model of the pipeline ->
#   M_ARCH, M_TASK (document_translation options for training, generation and
#   scoring), M_MODEL (model options), M_INIT (the model it starts from),
#   M_TARGET (1: target-side context: iterative decoding, Sec. 2.2, and the
#   references as target context for contrastive scoring, an oracle),
#   M_SELECTIVE (1: transformer_selective_doc, analysed as in Sec. 4.3).
ctx_model_spec() {
    local name=$1 integ rest mode attn
    M_INIT=sentence; M_TARGET=0; M_SELECTIVE=0; M_MODEL=(); M_GEN=(); M_FINETUNE=0; M_D2D=0
    case "$name" in
        concat)  # Tiedemann & Scherrer (2017) 2-to-2: one previous sentence on each side,
            # the stage-1 transformer fine-tuned (--finetune-from-model: the same
            # architecture); translated with its own previous translations as target
            # context; the pronoun suite and CXMI with the references (an oracle)
            M_ARCH=transformer_concat; M_FINETUNE=1
            M_TASK=(--task document_translation --concat-context --source-context-size 1
                    --target-context-size 1)
            M_GEN=(--own-target-context) ;;
        doc2doc|doc2doc_mr|gtrans)  # issue 39: recipes/lib/steps_doc2doc.sh
            d2d_spec "$name" "$D2D_MAX_TOKENS"
            M_ARCH=$D2D_ARCH; M_TASK=("${D2D_TASK[@]}"); M_GEN=("${D2D_GEN[@]}")
            M_MODEL=("${D2D_MODEL[@]}" --criterion label_smoothed_cross_entropy)
            M_FINETUNE=1; M_D2D=1 ;;
        context_aware)  # Voita et al. (2018): one previous source sentence
            M_ARCH=transformer_context_aware
            M_TASK=(--task document_translation --source-context-size 1) ;;
        zhang2018_enc|zhang2018_dec)
            # two previous source sentences, attended in the encoder or the
            # decoder (Table 3's two Zhang et al. columns); step 2 trains the
            # context part only (Zhang et al.'s two-step training)
            M_ARCH=transformer_doc_zhang2018
            M_TASK=(--task document_translation --source-context-size 2)
            if [ "$name" = zhang2018_enc ]; then
                M_MODEL=(--context-integration encoder --freeze-sentence-level)
            else
                M_MODEL=(--context-integration decoder --freeze-sentence-level)
            fi ;;
        han_enc)  # HAN encoder, k = 3 previous sentences
            M_ARCH=transformer_han_enc
            M_TASK=(--task document_translation --source-context-size 3) ;;
        han)  # HAN joint (encoder and decoder), from the HAN encoder
            M_ARCH=transformer_han
            M_TASK=(--task document_translation --source-context-size 3 --target-context-size 3)
            M_INIT=han_enc; M_TARGET=1 ;;
        *-*-*)
            integ=${name%%-*}; rest=${name#*-}; mode=${rest%%-*}; attn=${rest#*-}
            M_SELECTIVE=1
            case "$integ" in
                encoder) M_ARCH=transformer_selective_doc ;;
                decoder) M_ARCH=transformer_selective_doc_dec; M_TARGET=1 ;;
                *) die "VARIANTS: $name: expected encoder-... or decoder-..." ;;
            esac
            case "$mode" in
                offline|online) ;;
                *) die "VARIANTS: $name: expected $integ-offline-... or $integ-online-..." ;;
            esac
            # --memory-precomputed: the frozen memory is read from the model's cache, so
            # --max-tokens bounds a batch's own sentences, not its (long) documents
            M_TASK=(--task document_translation --document-context "$mode" --document-memory
                    --memory-precomputed)
            if [ "$M_TARGET" = 1 ]; then M_TASK+=(--target-context-size 1); fi
            case "$attn" in
                sentence) M_MODEL=(--doc-attention flat-sentence) ;;
                word) M_MODEL=(--doc-attention flat-word) ;;
                sparse-soft) M_MODEL=(--doc-attention hierarchical --sentence-attn sparsemax --word-attn softmax) ;;
                sparse-sparse) M_MODEL=(--doc-attention hierarchical --sentence-attn sparsemax --word-attn sparsemax) ;;
                *) die "VARIANTS: $name: expected sentence, word, sparse-soft or sparse-sparse after $integ-$mode-" ;;
            esac
            M_MODEL+=(--context-memory frozen) ;;
        *) die "unknown model $name (VARIANTS: INTEGRATION-DOC_CONTEXT-ATTENTION; BASELINES: context_aware, zhang2018_enc, zhang2018_dec, han_enc, han)" ;;
    esac
}

# ctx_maruf_train NAME INIT TRAIN_ARGS...: stage 2 of document-level model
# NAME from model INIT's best checkpoint. Every option is an argument (the
# pipeline spells out ctx_model_spec's), so that the step's marker records it.
ctx_maruf_train() {
    local name=$1 init=$2
    shift 2
    ctx_train_document "$WORK/data-bin" "$WORK/checkpoints/$name" "$WORK/checkpoints/$init" "$@"
}

# ctx_maruf_translate NAME TARGET BEAM GENERATE_ARGS...: the test translation;
# TARGET 1 (target-side context): iterative decoding, pass 1 by the
# sentence-level model (Sec. 2.2), never the references.
ctx_maruf_translate() {
    local name=$1 target=$2 beam=$3
    shift 3
    if [ "$target" = 1 ]; then
        ctx_iterative_translate "$name" "$WORK/data-bin" "$WORK/checkpoints/$name" \
            "$WORK/checkpoints/sentence" test "$beam" "$@"
    else
        ctx_translate "$name" "$WORK/data-bin" "$WORK/checkpoints/$name" test --beam "$beam" "$@"
    fi
}

# ctx_maruf_contrastive NAME SUITE [ARGS...]: pronoun accuracy with the model's
# own context (target-side context: the references, ARGS --gold-target-context,
# an oracle).
ctx_maruf_contrastive() {
    local name=$1 suite=$2
    shift 2
    cuda_args
    ctx_contrastive_suite "$name" "$WORK/data-bin" "$WORK/checkpoints/$name" "$suite" pronouns \
        --format toy --split test "$@" "${CUDA_ARGS[@]}"
}

# ctx_maruf_contrapro NAME CONTRAPRO_JSON CHECKSUM [ARGS...]: accuracy on
# ContraPro (Mueller et al. 2018; the paper's Table 4): contrapro.json with the
# files of its json2text_and_context.pl -c N beside it (checked by
# ctx_contrapro_check; CHECKSUM, their md5, is there for the step's marker).
# The raw text goes through this pipeline's own preprocessing: sacremoses as
# moses_tok (no escaping, entities whole, no aggressive dash splits), the
# truecasing models and the BPE codes. ARGS: --allow-partial-document for
# whole-document (online) models, which see only the N previous sentences
# ContraPro gives (reported).
ctx_maruf_contrapro() {
    local name=$1 json=$2
    shift 3
    cuda_args
    ctx_contrastive_suite "$name" "$WORK/data-bin" "$WORK/checkpoints/$name" "$json" contrapro \
        --format contrapro --suite-langs "$CTX_SRC-$CTX_TGT" --tokenizer moses --moses-no-escape \
        --moses-protect-entities --moses-no-dash-splits --moses-source-lang "$CTX_SRC" \
        --moses-target-lang "$CTX_TGT" --truecase-source-model "$WORK/tok/truecase-model.$CTX_SRC" \
        --truecase-target-model "$WORK/tok/truecase-model.$CTX_TGT" \
        --bpe subword_nmt --bpe-codes "$WORK/bpe/codes" "$@" "${CUDA_ARGS[@]}"
}

# ctx_maruf_cxmi NAME MAX_TOKENS: how much NAME uses its context (Fernandes et
# al. 2021): ctx-cxmi of its best checkpoint on the test split, the true context
# against shuffled context (another document position's real context; a
# document memory: another document's memory), in nats per target token, into
# $WORK/results/NAME/cxmi/ (cxmi.json, cxmi.md, tokens.jsonl, plots) and
# results/NAME/cxmi.log. Target-side context is the references (teacher
# forcing), as in training. MAX_TOKENS: padded tokens per batch, context
# included (an argument, so that the step's marker records it).
ctx_maruf_cxmi() {
    local name=$1 max_tokens=$2 ckpt dev=(--cpu) docs
    docs=$(ctx_count_docs "$WORK/data-bin/test.docids")
    if [ "$docs" -lt 2 ]; then  # ctx-cxmi refuses shuffled context without another document
        echo "cxmi_$name: the test split has $docs document(s): no shuffled context to measure against"
        ctx_cxmi_skipped "$WORK/results/$name/cxmi" "$docs"
        return 0
    fi
    ckpt=$(best_checkpoint "$WORK/checkpoints/$name")
    cuda_args
    [ ${#CUDA_ARGS[@]} -eq 0 ] || dev=()
    ctx_logged "$WORK/results/$name/cxmi.log" ctx-cxmi --path "$ckpt" --data "$WORK/data-bin" \
        --split test --out "$WORK/results/$name/cxmi" --conditions shuffled \
        --max-tokens "$max_tokens" --lang "$CTX_TGT" "${dev[@]}"
}

# ctx_contrapro_check JSON: before any step, ContraPro's converted files are
# there and give at least the previous sentences every model to score reads
# (CONTRAPRO_N); CONTRAPRO_SUM: their md5, for the steps' markers.
ctx_contrapro_check() {
    local json=$1 base f n_text n_ctx need=0 m
    [ -f "$json" ] || die "CONTRAPRO=$json: no such file (expected ContraPro's contrapro.json, with the files of its json2text_and_context.pl beside it)"
    base=${json%.json}
    for f in "$base.text.$CTX_SRC" "$base.text.$CTX_TGT" "$base.context.$CTX_SRC" "$base.context.$CTX_TGT"; do
        [ -s "$f" ] || die "CONTRAPRO: $f: missing or empty; convert the suite beside $json: perl conversion_scripts/json2text_and_context.pl -s $CTX_SRC -t $CTX_TGT -d OpenSubtitles2018/documents -j $(basename "$json") -c 3"
    done
    n_text=$(ctx_lines "$base.text.$CTX_SRC")
    n_ctx=$(ctx_lines "$base.context.$CTX_SRC")
    [ "$n_text" -gt 0 ] || die "CONTRAPRO: $base.text.$CTX_SRC has no complete line (expected one example per line, each ended by a newline)"
    [ $((n_ctx % n_text)) -eq 0 ] || die "CONTRAPRO: $base.context.$CTX_SRC has $n_ctx lines, not a multiple of the $n_text lines of $base.text.$CTX_SRC (expected N context lines per example)"
    CONTRAPRO_N=$((n_ctx / n_text))
    for m in "${DOC_MODELS[@]}"; do
        case "$m" in
            context_aware|concat) [ "$need" -ge 1 ] || need=1 ;;
            zhang2018_*) [ "$need" -ge 2 ] || need=2 ;;
            han_enc|han) need=3 ;;
        esac
    done
    [ "$CONTRAPRO_N" -ge "$need" ] || die "CONTRAPRO: converted with $CONTRAPRO_N previous sentences (-c $CONTRAPRO_N), but the models to score read up to $need: convert it again with -c 3"
    CONTRAPRO_SUM=$(cat "$json" "$base.text.$CTX_SRC" "$base.text.$CTX_TGT" "$base.context.$CTX_SRC" \
        "$base.context.$CTX_TGT" | md5sum | cut -d' ' -f1)
}

# ctx_maruf_contrapro_applies NAME: whether NAME is scored on ContraPro
# (offline models read following sentences, which ContraPro does not give).
ctx_maruf_contrapro_applies() {
    [ -n "${CONTRAPRO:-}" ] || return 1
    case "$1" in
        doc2doc|doc2doc_mr|gtrans)
            log "$1: not scored on ContraPro (a segment model: ContraPro's context is not a segment of this pipeline's documents)"
            return 1 ;;
        *-offline-*)
            log "$1: not scored on ContraPro (offline context reads following sentences; ContraPro gives previous ones)"
            return 1 ;;
    esac
    return 0
}

# ctx_maruf_models: every model with results in $WORK/results, this run's
# first (sentence, then DOC_MODELS in order), then those of earlier runs.
ctx_maruf_models() {
    local m d seen=" sentence ${DOC_MODELS[*]} "
    printf '%s\n' sentence "${DOC_MODELS[@]}"
    for d in "$WORK"/results/*/tokenized_bleu.json; do
        [ -e "$d" ] || continue
        m=$(basename "$(dirname "$d")")
        case "$seen" in *" $m "*) continue ;; esac
        case "$m" in analysis-*) continue ;; esac
        if ! (ctx_model_spec "$m") > /dev/null 2>&1; then
            log "results/$m: not a model of this pipeline (an older version's name?); left out of the table"
            continue
        fi
        printf '%s\n' "$m"
    done
}

# ctx_maruf_report: results/table.md and results/table.json (every model with
# results, this run's and earlier runs'), results/summary.md (the table, then each tool's lines),
# results/complexity.md (Table 5: parameters and speeds); each rewritten only
# when it changes, never half-written.
ctx_maruf_report() {
    local m specs=() logs=() label
    while read -r m; do
        [ -e "$WORK/results/$m/tokenized_bleu.json" ] || continue
        if [ "$m" = sentence ]; then
            label=transformer
            logs+=("transformer=$WORK/logs/train-sentence.log:$WORK/logs/generate-sentence.log:$WORK/checkpoints/sentence")
        else
            ctx_model_spec "$m"
            label=$M_ARCH
            [ "$M_D2D" = 0 ] || label="$(d2d_arch_label "$m"); the frame; pronoun suite with the references as the segment's prefix (an oracle)"
            if [ "$m" = concat ]; then
                label="$label (2-to-2, from the sentence model): pronouns scored and CXMI measured with the references as target context (an oracle)"
            fi
            if [ "$M_TARGET" = 1 ]; then
                label="$label: iterative decoding (2 passes); pronouns scored and CXMI measured with the references as target context (an oracle)"
            fi
            if [ "$M_SELECTIVE" = 1 ] && [ -e "$WORK/results/$m/contrastive_contrapro.json" ]; then
                label="$label; ContraPro scored with only the previous sentences ContraPro gives, not the whole document"
            fi
            logs+=("$m=$WORK/logs/train-$m.log:$WORK/logs/generate-$m.log:$WORK/checkpoints/$m")
        fi
        specs+=("$m=$label")
    done < <(ctx_maruf_models)
    ctx_write_if_changed "$WORK/results/table.md" _ctx_maruf_table "${specs[@]}"
    ctx_write_if_changed "$WORK/results/table.json" ctx_results_table json "${specs[@]}"
    ctx_summary "$WORK/results/summary.md" "$WORK/results/table.md"
    ctx_write_if_changed "$WORK/results/complexity.md" _ctx_complexity_text "${logs[@]}"
    d2d_maruf_table "${specs[@]}"
}
_ctx_maruf_table() {
    ctx_results_table md "$@" || return 1
    printf '\ntest: %s documents, %s sentences; pronoun suite: %s records (ctx-make-pronoun-suite: source "it", distance unknown).\n' \
        "$(ctx_count_docs "$WORK/data-bin/test.docids")" "$(ctx_lines "$WORK/data-bin/test.docids")" \
        "$(ctx_lines "$WORK/suite/test.pronouns.jsonl")"
    printf 'Tokenized BLEU: the tokenised, truecased hypotheses against the references processed the same way (the paper'"'"'s "BLEU on tokenised text", Sec. 4.1). sacreBLEU: the hypotheses detruecased and detokenized against the original references.\n'
    printf 'p: sacreBLEU'"'"'s paired bootstrap (Koehn 2004; ctx_fairseq.eval.scoring.significance, results/MODEL/paired.json) of the tokenized BLEU against the sentence-level transformer, over sentences / over documents (n/a with fewer than 10 documents).\n'
    printf 'CXMI vs shuffled (ctx-cxmi --conditions shuffled, results/MODEL/cxmi/): on the test references, the mean over sentences of the per-sentence mean log-probability with the true context minus with shuffled context (another document position'"'"'s; a document memory: another document'"'"'s), nats: a sensitivity check (Voita et al. 2018); cxmi.json also has the paper'"'"'s CXMI against the empty context (none), out of distribution for a model trained without a sampled context size; "-": sentence-level.\n'
}

# ctx_paired NAME TOK_REFS DOCIDS: sacreBLEU's paired bootstrap of NAME's
# tokenized BLEU against the sentence-level transformer (generate/sentence.txt),
# over sentences and over documents, into results/NAME/paired.json
ctx_paired() {
    local name=$1 refs=$2 docids=$3
    ctx_logged "$WORK/results/$name/paired.log" "$PY" -m ctx_fairseq.eval.scoring.significance \
        --generate --baseline "$WORK/generate/sentence.txt" --system "$WORK/generate/$name.txt" \
        --refs "$refs" --docids "$docids" --tokenize none --out "$WORK/results/$name/paired.json"
}

# ctx_maruf_run SRC TGT: a Maruf et al. recipe after its settings: its download
# step (the recipe's function download; skipped with --raw, and --smoke needs
# --raw), its prep step (the recipe's function prep, which writes $WORK/docs),
# then ctx_maruf_pipeline SRC TGT.
ctx_maruf_run() {
    if [ -n "$RAW" ]; then
        log "skip download (--raw $RAW)"
    else
        smoke_needs_raw
        step download download
    fi
    step prep prep
    ctx_maruf_pipeline "$1" "$2"
}

# ctx_maruf_pipeline SRC TGT: every step after the document data ($WORK/docs).
ctx_maruf_pipeline() {
    local s=$1 t=$2 bin="$WORK/data-bin" suite="$WORK/suite/test.pronouns.jsonl" m gold partial
    CTX_SRC=$s
    CTX_TGT=$t
    case "${UNTIL:-}" in
        ''|data) ;;
        *) die "UNTIL=$UNTIL: expected data (stop after the data steps) or nothing" ;;
    esac
    ctx_maruf_config
    if [ -n "${CONTRAPRO:-}" ]; then
        [ -f "$CONTRAPRO" ] || die "CONTRAPRO=$CONTRAPRO: no such file (expected ContraPro's contrapro.json, with the files of its json2text_and_context.pl beside it)"
        CONTRAPRO=$(cd "$(dirname "$CONTRAPRO")" && pwd)/$(basename "$CONTRAPRO")
        ctx_contrapro_check "$CONTRAPRO"
    fi
    ctx_check_splits "$WORK/docs" "$s" "$t"
    log "models: transformer (stage 1) then ${DOC_MODELS[*]} (BASELINES, VARIANTS)"
    step truecase ctx_moses_truecase "$s" "$t" "$WORK/docs" "$WORK/tok"
    step bpe ctx_bpe_joint "$BPE_MERGES" "$s" "$t" "$WORK/tok" "$WORK/bpe"
    step binarize preprocess "$s" "$t" "$WORK/bpe" "$bin" --joined-dictionary
    if [ "$s-$t" = en-de ]; then
        step suite ctx_pronoun_suite "$WORK/bpe/test.$s" "$WORK/bpe/test.$t" "$bin/test.docids" \
            "$WORK/bpe/codes" "$suite"
    else
        die "the pronoun suite (ctx-make-pronoun-suite) is English-German only; this pipeline is for en-de"
    fi
    if [ "${UNTIL:-}" = data ]; then
        log "UNTIL=data: the data are ready in $bin (pronoun suite: $WORK/suite); stopping before training"
        return 0
    fi
    step train_sentence ctx_train_sentence "$bin" "$WORK/checkpoints/sentence" "${SENT_TRAIN[@]}"
    for m in "${DOC_MODELS[@]}"; do
        ctx_model_spec "$m"
        # concat and the doc2doc rows (issue 39) train below, each just before its evaluation
        [ "$M_FINETUNE" = 0 ] || continue
        step "train_$m" ctx_maruf_train "$m" "$M_INIT" --arch "$M_ARCH" "${M_TASK[@]}" \
            "${M_MODEL[@]}" "${DOC_COMMON[@]}"
    done
    step translate_sentence ctx_translate sentence "$bin" "$WORK/checkpoints/sentence" test \
        --beam "$BEAM" "${GEN[@]}"
    step bleu_sentence ctx_bleu_report sentence "$bin/test.docids" "$WORK/tok/test.$t" \
        "$WORK/docs/test.$t" "$t" --detruecase
    step contrastive_sentence ctx_maruf_contrastive sentence "$suite"
    if ctx_maruf_contrapro_applies sentence; then
        step contrapro_sentence ctx_maruf_contrapro sentence "$CONTRAPRO" "$CONTRAPRO_SUM"
    fi
    for m in "${DOC_MODELS[@]}"; do
        ctx_model_spec "$m"
        gold=()
        partial=()
        # the references as target context (an oracle): target-side context (concat, segments too)
        if [ "$M_TARGET" = 1 ] || [ "$M_FINETUNE" = 1 ]; then gold=(--gold-target-context); fi
        if [ "$M_SELECTIVE" = 1 ]; then partial=(--allow-partial-document); fi
        if [ "$M_FINETUNE" = 1 ]; then
            step "train_$m" ctx_maruf_finetune "$m" --arch "$M_ARCH" "${M_TASK[@]}" \
                "${DOC_COMMON[@]}" "${M_MODEL[@]}"
        fi
        if [ "$M_D2D" = 1 ]; then  # segments, the frame, split back into sentences
            step "translate_$m" d2d_translate "$m" "$bin" "$WORK/checkpoints/$m" test \
                --beam "$BEAM" "${GEN[@]}" "${M_TASK[@]}" "${M_GEN[@]}"
        else
            step "translate_$m" ctx_maruf_translate "$m" "$M_TARGET" "$BEAM" "${GEN[@]}" \
                "${M_TASK[@]}" "${M_GEN[@]}"
        fi
        step "bleu_$m" ctx_bleu_report "$m" "$bin/test.docids" "$WORK/tok/test.$t" \
            "$WORK/docs/test.$t" "$t" --detruecase
        step "paired_$m" ctx_paired "$m" "$WORK/tok/test.$t" "$bin/test.docids"
        step "contrastive_$m" ctx_maruf_contrastive "$m" "$suite" "${gold[@]}"
        step "cxmi_$m" ctx_maruf_cxmi "$m" "$MAX_TOKENS"
        if ctx_maruf_contrapro_applies "$m"; then
            step "contrapro_$m" ctx_maruf_contrapro "$m" "$CONTRAPRO" "$CONTRAPRO_SUM" "${partial[@]}"
        fi
        if [ "$M_SELECTIVE" = 1 ]; then
            step "analysis_$m" ctx_selective_analyses "analysis-$m" "$bin" "$WORK/checkpoints/$m" \
                "$N_ANALYSED"
        fi
    done
    # issue 39: the per-segment d-BLEU of every model, on one segment map (only in a
    # run with a doc2doc row: the other runs' steps and results are unchanged)
    if d2d_any "${DOC_MODELS[@]}"; then
        step "segmap_$D2D_MAX_TOKENS" d2d_segment_map "$bin" test "$D2D_MAX_TOKENS" \
            "$WORK/segments/test.$D2D_MAX_TOKENS.segments"
        for m in sentence "${DOC_MODELS[@]}"; do
            step "segbleu_$m" ctx_maruf_segment_bleu "$m" \
                "$WORK/segments/test.$D2D_MAX_TOKENS.segments" "$WORK/tok/test.$t" "$WORK/docs/test.$t"
        done
        for m in "${DOC_MODELS[@]}"; do
            step "pairedseg_$m" d2d_paired_segments "$m" sentence \
                "$WORK/segments/test.$D2D_MAX_TOKENS.segments" "$bin/test.docids" "$WORK/tok/test.$t"
        done
    fi
    ctx_maruf_report
    log "done: $WORK/results/summary.md"
    cat "$WORK/results/table.md"
}
