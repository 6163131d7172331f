#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# IWSLT17 TED talks en-de as documents (one talk = one document): the set-up
# of Maruf, Martins & Haffari (NAACL 2019), "Selective Attention for
# Context-aware Neural Machine Translation", Sec. 4.1. See README.md here for
# the steps, the hyper-parameter table and the outputs.
set -euo pipefail

RECIPE_NAME=iwslt17_ted_en_de
RECIPE_USAGE="usage: recipes/iwslt17_ted_en_de/run.sh [--workdir DIR] [--smoke | --study] [--raw DIR] [--cpu]

IWSLT17 TED en-de documents: download, ctx-prep-docs (talks as documents),
then the pipeline shared with the News Commentary and Europarl recipes
(recipes/lib/steps_context.sh): sacremoses tokenisation and truecasing, joint
subword-nmt BPE, fairseq-preprocess with docids, a pronoun suite of the test
talks, stage 1 sentence-level transformer, stage 2 the selective attention
models (VARIANTS) and the context-aware baselines (BASELINES) from it,
fairseq-generate (iterative decoding for target-side context), tokenized BLEU
and sacreBLEU per sentence and per document (signatures), contrastive pronoun
accuracy, the paper's analyses.

  --workdir DIR  everything goes here        [work/iwslt17_ted_en_de]
  --smoke        the local steps on the XML dev/test sets given with --raw
                 (train/valid/test split by talks), tiny models, a few hundred
                 updates, on the CPU (in DIR/smoke)
  --raw DIR      the extracted files (train.tags.en-de.{en,de},
                 IWSLT17.TED.*.en-de.{en,de}.xml, IWSLT17.TED.tst201[67].de-en.de.xml)
                 instead of downloading; with --smoke: the IWSLT17 XML files
  --study        the CPU study (in DIR/study): a small shape and a fixed number of
                 updates (README.md, 'CPU study'); the models of issue 39 by default
                 (doc2doc doc2doc_mr gtrans concat); resumable
  --cpu          train and translate on the CPU

Without train.tags.en-de.* under --raw (the shared copy holds the XML sets
only), the full and --study modes train on dev2010 and tst2010-tst2014 (the
first 3 talks of tst2014 held out for validation) and test on tst2015, and
say so; with them, on the training talks as the paper.

Environment (defaults in README.md): UNTIL=data (stop after the data steps),
VARIANTS, BASELINES, BEAM, MAX_TOKENS, BPE_MERGES, SEED, DEV_SETS, TEST_SETS,
D2D_MAX_TOKENS, STUDY_SENT_UPDATES, STUDY_DOC_UPDATES,
IWSLT17_TRAIN_URL/_MD5, IWSLT17_TEST_URL_EN_DE/_MD5, IWSLT17_TEST_URL_DE_EN/_MD5,
PYTHON, TRAIN_EXTRA, GEN_EXTRA."

# --study is this recipe's own option; the rest are the shared ones
STUDY=0
_args=()
for _a in "$@"; do
    if [ "$_a" = --study ]; then STUDY=1; else _args+=("$_a"); fi
done
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/recipe.sh
. "$HERE/../lib/recipe.sh"
recipe_init "${_args[@]}"
smoke_needs_raw
if [ "$STUDY" = 1 ]; then
    [ "$SMOKE" = 0 ] || die "--smoke and --study exclude each other"
    WORK="$WORK/study"
    mkdir -p "$WORK/.done" "$WORK/logs"
    # shellcheck disable=SC2034  # read by ctx_maruf_config (recipes/lib/steps_context.sh)
    MARUF_STUDY=1
    if [ -z "${OMP_NUM_THREADS:-}" ]; then
        export OMP_NUM_THREADS=1
        log "study mode: OMP_NUM_THREADS=1 (set OMP_NUM_THREADS to choose another number)"
    fi
    log "study mode: work directory $WORK"
    # the study's models: BASELINES' study default (ctx_maruf_config), no selective variant
    VARIANTS=${VARIANTS-}
fi

L1=en
L2=de
WIT3=https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive
# The IWSLT17 release on WIT3's GitHub mirror (the URLs and MD5 sums sacreBLEU uses
# for its iwslt17 test sets): training talks and dev sets; the 2017 evaluation
# sets tst2016/tst2017 (English in en-de, German in de-en: the same talks).
TRAIN_URL=${IWSLT17_TRAIN_URL:-$WIT3/2017-01-trnted/texts/en/de/en-de.tgz}
TRAIN_MD5=${IWSLT17_TRAIN_MD5-d8a32cfc002a4f12b17429cfa78050e6}
TEST_URL_EN_DE=${IWSLT17_TEST_URL_EN_DE:-$WIT3/2017-01-ted-test/texts/en/de/en-de.tgz}
TEST_MD5_EN_DE=${IWSLT17_TEST_MD5_EN_DE-b68e7097b179491f6c466ef41ad72b9b}
TEST_URL_DE_EN=${IWSLT17_TEST_URL_DE_EN:-$WIT3/2017-01-ted-test/texts/de/en/de-en.tgz}
TEST_MD5_DE_EN=${IWSLT17_TEST_MD5_DE_EN-e3f5b2a075a2da1a395c8b60bf1e9be1}

# Splits (paper, Sec. 4.1: "We combine tst2016-2017 into the test set and the
# rest are used for development"; training: the IWSLT17 training talks).
DEV_SETS=${DEV_SETS:-dev2010 tst2010 tst2011 tst2012 tst2013 tst2014 tst2015}
TEST_SETS=${TEST_SETS:-tst2016 tst2017}
# Smoke: the XML sets only, split by talks.
SMOKE_TRAIN_SETS=(dev2010 tst2010 tst2011 tst2012 tst2013)
SMOKE_VALID_SET=tst2014
SMOKE_VALID_TALKS=3
SMOKE_TEST_SET=tst2015
SMOKE_TEST_TALKS=4

# The shared copy (../shared/data/iwslt17-ted-en-de) has the XML sets only: without
# the training talks (train.tags), the full and study modes train on dev2010 and
# tst2010-tst2014 (XML_VALID_TALKS talks of tst2014 held out for validation) and
# test on tst2015: TED_SPLITS=xml (said in the log and in results/splits.txt).
XML_TRAIN_SETS=(dev2010 tst2010 tst2011 tst2012 tst2013 tst2014)
XML_VALID_TALKS=3
XML_TEST_SET=tst2015
TED_SPLITS=paper
if [ "$SMOKE" = 1 ]; then
    TED_SPLITS=smoke
elif [ -n "$RAW" ] && [ ! -e "$RAW/train.tags.$L1-$L2.$L1" ]; then
    TED_SPLITS=xml
    log "no $RAW/train.tags.$L1-$L2.$L1 (the XML sets only): training on dev2010 and tst2010-tst2014 (the first $XML_VALID_TALKS talks of tst2014 held out for validation), testing on tst2015; not the paper's split"
fi
# the prep step reads them outside --smoke: its marker records them (TED_SPLITS where
# it is xml: the markers of the earlier modes' work directories stay valid)
if [ "$TED_SPLITS" = xml ]; then RECIPE_SETTINGS+=(TED_SPLITS); fi
if [ "$TED_SPLITS" = paper ]; then RECIPE_SETTINGS+=(DEV_SETS TEST_SETS); fi
read -r -a DEV_LIST <<< "$DEV_SETS"
read -r -a TEST_LIST <<< "$TEST_SETS"
if [ "${#DEV_LIST[@]}" -eq 0 ] || [ "${#TEST_LIST[@]}" -eq 0 ]; then
    die "DEV_SETS and TEST_SETS name at least one set each"
fi
# the models and hyper-parameters are those of recipes/lib/steps_context.sh
# (ctx_maruf_config: the paper's Sec. 4.1 and the authors' released commands),
# which reads DEFAULT_VARIANTS and the SMOKE_* settings set here
# shellcheck disable=SC2034
DEFAULT_VARIANTS="encoder-online-sparse-soft encoder-online-sparse-sparse"
# shellcheck disable=SC2034
if [ "$SMOKE" = 1 ]; then
    # tiny models gain nothing from several threads, and on a busy CPU threaded
    # runs slow down several times over (measured: README.md)
    if [ -z "${OMP_NUM_THREADS:-}" ]; then
        export OMP_NUM_THREADS=1
        log "smoke mode: OMP_NUM_THREADS=1 (set OMP_NUM_THREADS to choose another number)"
    fi
    DEFAULT_VARIANTS=encoder-online-sparse-soft
    # a stage-1 model that translates a little: more updates and a higher rate
    # than the pipeline's smoke defaults (stage 2 keeps the paper's 1e-4)
    SMOKE_DIM=64
    SMOKE_SENT_UPDATES=${SMOKE_SENT_UPDATES:-300}
    SMOKE_DOC_UPDATES=60
    SMOKE_SENT_LR=1e-3
    SMOKE_BPE_MERGES=2000
    SMOKE_MAX_TOKENS=2048
fi

# ----------------------------------------------------------------------------- data

# The files the download step leaves in $WORK/raw (or --raw DIR gives).
raw_names() {
    local s
    printf '%s\n' "train.tags.$L1-$L2.$L1" "train.tags.$L1-$L2.$L2"
    for s in "${DEV_LIST[@]}"; do
        printf '%s\n' "IWSLT17.TED.$s.$L1-$L2.$L1.xml" "IWSLT17.TED.$s.$L1-$L2.$L2.xml"
    done
    for s in "${TEST_LIST[@]}"; do
        printf '%s\n' "IWSLT17.TED.$s.$L1-$L2.$L1.xml" "IWSLT17.TED.$s.$L2-$L1.$L2.xml"
    done
}

download() {
    local dl="$WORK/downloads" part="$WORK/raw.part" name found n
    fetch "$TRAIN_URL" "$dl/2017-01-trnted.en-de.${TRAIN_URL##*.}"
    fetch "$TEST_URL_EN_DE" "$dl/2017-01-ted-test.en-de.${TEST_URL_EN_DE##*.}"
    fetch "$TEST_URL_DE_EN" "$dl/2017-01-ted-test.de-en.${TEST_URL_DE_EN##*.}"
    ctx_check_md5 "$dl/2017-01-trnted.en-de.${TRAIN_URL##*.}" "$TRAIN_MD5"
    ctx_check_md5 "$dl/2017-01-ted-test.en-de.${TEST_URL_EN_DE##*.}" "$TEST_MD5_EN_DE"
    ctx_check_md5 "$dl/2017-01-ted-test.de-en.${TEST_URL_DE_EN##*.}" "$TEST_MD5_DE_EN"
    rm -rf "$part"
    mkdir -p "$part/x"
    ctx_extract_archive "$dl/2017-01-trnted.en-de.${TRAIN_URL##*.}" "$part/x/trnted"
    ctx_extract_archive "$dl/2017-01-ted-test.en-de.${TEST_URL_EN_DE##*.}" "$part/x/test-en-de"
    ctx_extract_archive "$dl/2017-01-ted-test.de-en.${TEST_URL_DE_EN##*.}" "$part/x/test-de-en"
    while read -r name; do
        found=$(find "$part/x" -type f -name "$name")
        n=$(printf '%s' "$found" | grep -c . || true)
        if [ "$n" -ne 1 ]; then
            rm -rf "$part"
            die "the archives hold $n files named $name, expected one (a different release?)"
        fi
        mv "$found" "$part/$name"
    done < <(raw_names)
    rm -rf "$part/x" "$WORK/raw"
    mv "$part" "$WORK/raw"
}

# prep: talks to line-aligned files with docids ($WORK/docs/{train,valid,test}.{en,de,docids})
xml_files() {  # xml_files TGT_PAIR SET...: XML_FILES=(the sets' raw XML files: source, target ...)
    local tgt_pair=$1 s f
    shift
    XML_FILES=()
    for s in "$@"; do
        f=$(raw_file "IWSLT17.TED.$s.$L1-$L2.$L1.xml")
        XML_FILES+=("$f")
        f=$(raw_file "IWSLT17.TED.$s.$tgt_pair.$L2.xml")
        XML_FILES+=("$f")
    done
}

# xml_split_off PREFIX N VALID TRAIN: the first N documents of PREFIX.{en,de,docids}
# to VALID.*, the rest appended to TRAIN.*
xml_split_off() {
    local in=$1 n=$2 valid=$3 train=$4 lines ext
    lines=$(awk -v n="$n" '{ if ($1 != prev) { d++; prev = $1 } if (d > n) { print NR - 1; exit } }
        END { if (d <= n) print NR }' "$in.docids")
    for ext in "$L1" "$L2" docids; do
        head -n "$lines" "$in.$ext" > "$valid.$ext"
        tail -n +"$((lines + 1))" "$in.$ext" >> "$train.$ext"
    done
}

prep() {
    local p="$WORK/docs" s src tgt
    mkdir -p "$p"
    if [ "$TED_SPLITS" = xml ]; then
        xml_files "$L1-$L2" "${XML_TRAIN_SETS[@]:0:5}"
        ctx_prep_xml_sets "$p/train" "$L1" "$L2" 0 "${XML_FILES[@]}"
        xml_files "$L1-$L2" "${XML_TRAIN_SETS[5]}"
        ctx_prep_xml_sets "$p/heldin" "$L1" "$L2" 0 "${XML_FILES[@]}"
        xml_split_off "$p/heldin" "$XML_VALID_TALKS" "$p/valid" "$p/train"
        rm -f "$p/heldin".*
        xml_files "$L1-$L2" "$XML_TEST_SET"
        ctx_prep_xml_sets "$p/test" "$L1" "$L2" 0 "${XML_FILES[@]}"
    elif [ "$SMOKE" = 1 ]; then
        xml_files "$L1-$L2" "${SMOKE_TRAIN_SETS[@]}"
        ctx_prep_xml_sets "$p/train" "$L1" "$L2" 0 "${XML_FILES[@]}"
        xml_files "$L1-$L2" "$SMOKE_VALID_SET"
        ctx_prep_xml_sets "$p/valid" "$L1" "$L2" "$SMOKE_VALID_TALKS" "${XML_FILES[@]}"
        xml_files "$L1-$L2" "$SMOKE_TEST_SET"
        ctx_prep_xml_sets "$p/test" "$L1" "$L2" "$SMOKE_TEST_TALKS" "${XML_FILES[@]}"
    else
        src=$(raw_file "train.tags.$L1-$L2.$L1")
        tgt=$(raw_file "train.tags.$L1-$L2.$L2")
        ctx-prep-docs tags --src "$src" --tgt "$tgt" --src-lang "$L1" --tgt-lang "$L2" \
            --out-prefix "$p/train"
        xml_files "$L1-$L2" "${DEV_LIST[@]}"
        ctx_prep_xml_sets "$p/valid" "$L1" "$L2" 0 "${XML_FILES[@]}"
        # the test talks' German side is the source of the de-en evaluation set
        xml_files "$L2-$L1" "${TEST_LIST[@]}"
        ctx_prep_xml_sets "$p/test" "$L1" "$L2" 0 "${XML_FILES[@]}"
    fi
    ctx_check_splits "$p" "$L1" "$L2"
    ctx_check_disjoint "$p"  # the splits share no talk
    for s in train valid test; do
        log "$s: $(ctx_count_docs "$p/$s.docids") talks, $(wc -l < "$p/$s.docids") lines"
    done
}

# ---------------------------------------------------------------------------- steps

if [ -z "$RAW" ]; then step download download; fi
step prep prep
mkdir -p "$WORK/results"
case $TED_SPLITS in
    xml) printf 'splits: the XML sets only (no train.tags): training dev2010, tst2010-tst2013 and tst2014 but its first %s talks (validation); test tst2015 (all talks). Not the paper'"'"'s split (training talks; test tst2016+tst2017).\n' "$XML_VALID_TALKS" ;;
    smoke) printf 'splits: smoke (dev2010, tst2010-tst2013; validation: 3 talks of tst2014; test: 4 talks of tst2015)\n' ;;
    paper) printf 'splits: the paper'"'"'s (training talks of train.tags; development %s; test %s)\n' "$DEV_SETS" "$TEST_SETS" ;;
esac > "$WORK/results/splits.txt"
ctx_maruf_pipeline "$L1" "$L2"
