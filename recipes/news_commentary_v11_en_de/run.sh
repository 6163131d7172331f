#!/usr/bin/env bash
# News Commentary v11 en-de, document-level (Maruf, Martins & Haffari, NAACL 2019,
# Sec. 4.1): training documents of News Commentary v11, newstest2015 (dev) and
# newstest2016 (test) with their WMT document ids; Moses tokenisation and
# truecasing, joint BPE (30K merges), a 4-layer sentence-level Transformer, then
# the selective-attention document model initialised from it (two stages),
# sentence- and document-level BLEU, the paper's analyses. See README.md.
set -euo pipefail

RECIPE_NAME=news_commentary_v11_en_de
RECIPE_USAGE="usage: recipes/news_commentary_v11_en_de/run.sh [--workdir DIR] [--raw DIR] [--smoke] [--cpu]

  --raw DIR   the files the download step would leave in WORKDIR/raw:
                DIR/dev/newstest2015-ende-src.en.sgm   DIR/dev/newstest2015-ende-ref.de.sgm
                DIR/test/newstest2016-ende-src.en.sgm  DIR/test/newstest2016-ende-ref.de.sgm
              and the training documents, which no public download provides with
              their boundaries (see README.md), either
                DIR/train/news-commentary-v11.doc.en + .de  (a line '<d>' before each document)
              or
                DIR/train/aligned/en/ + DIR/train/aligned/de/  (one line-aligned file per document)
  --smoke     every local step on DIR's few lines, tiny model, a few updates
Environment: INTEGRATION, DOC_CONTEXT, VARIANT (the model of Tables 2-3), BEAM,
MAX_TOKENS, BPE_MERGES, SEED, TRAIN_EXTRA, GEN_EXTRA, PYTHON (see README.md)."
# shellcheck source=SCRIPTDIR/../lib/recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/recipe.sh"
recipe_init "$@"

SRC=en
TGT=de
WMT16=${WMT16_URL:-http://data.statmt.org/wmt16/translation-task}
DEV_SGM=(dev/newstest2015-ende-src.en.sgm dev/newstest2015-ende-ref.de.sgm)
TEST_SGM=(test/newstest2016-ende-src.en.sgm test/newstest2016-ende-ref.de.sgm)
TRAIN_DOC=(train/news-commentary-v11.doc.en train/news-commentary-v11.doc.de)

train_docs_message() {
    cat <<MSG
News Commentary v11 with document boundaries is not in any file this recipe can
download: WMT16's training-parallel-nc-v11.tgz has one sentence per line and no
document boundaries. Maruf et al. (2019) used the "sentence-aligned
document-delimited" release from CASMACAT (www.casmacat.eu/corpus/news-commentary.html).
Put the training documents in $1, either as
  train/news-commentary-v11.doc.en and train/news-commentary-v11.doc.de
  (one sentence per line, a line '<d>' before each document, the format of the
  authors' released data), or as
  train/aligned/en/NAME and train/aligned/de/NAME (one line-aligned file pair per
  document; lines that are a single tag, e.g. <P>, are dropped),
then re-run (finished steps are skipped).
MSG
}

# download: the WMT16 dev and test sets (public); the training documents must be supplied.
download() {
    local d="$WORK/raw" f
    mkdir -p "$d/downloads"
    fetch "$WMT16/dev.tgz" "$d/downloads/wmt16-dev.tgz"
    fetch "$WMT16/test.tgz" "$d/downloads/wmt16-test.tgz"
    for f in "${DEV_SGM[@]}"; do
        [ -s "$d/$f" ] || atomic "$d/$f" tar -xzOf "$d/downloads/wmt16-dev.tgz" "$f"
    done
    for f in "${TEST_SGM[@]}"; do
        [ -s "$d/$f" ] || atomic "$d/$f" tar -xzOf "$d/downloads/wmt16-test.tgz" "$f"
    done
    if [ ! -s "$d/${TRAIN_DOC[0]}" ] && [ ! -d "$d/train/aligned/$SRC" ]; then
        train_docs_message "$d" >&2
        die "the News Commentary v11 training documents are missing (see above)"
    fi
}

# prep: dev/test from the WMT SGML (ctx-prep-docs sgml: the <doc docid> of each
# sentence), the training documents (ctx-prep-corpora).
prep() {
    local raw=${RAW:-$WORK/raw} out="$WORK/docs" f
    mkdir -p "$out"
    for f in "${DEV_SGM[@]}" "${TEST_SGM[@]}"; do ctx_need "$raw/$f" "WMT16 dev/test set"; done
    ctx-prep-docs sgml --src-sgm "$raw/${DEV_SGM[0]}" --tgt-sgm "$raw/${DEV_SGM[1]}" \
        --src-lang "$SRC" --tgt-lang "$TGT" --out-prefix "$out/valid"
    ctx-prep-docs sgml --src-sgm "$raw/${TEST_SGM[0]}" --tgt-sgm "$raw/${TEST_SGM[1]}" \
        --src-lang "$SRC" --tgt-lang "$TGT" --out-prefix "$out/test"
    if [ -s "$raw/${TRAIN_DOC[0]}" ]; then
        ctx_prep_corpora doc-delimited --src "$raw/${TRAIN_DOC[0]}" --tgt "$raw/${TRAIN_DOC[1]}" \
            --doc-prefix nc --src-lang "$SRC" --tgt-lang "$TGT" --out-prefix "$out/train" \
            --summary "$out/train.summary.json"
    elif [ -d "$raw/train/aligned/$SRC" ]; then
        ctx_prep_corpora aligned-sessions --unit file --src-dir "$raw/train/aligned/$SRC" \
            --tgt-dir "$raw/train/aligned/$TGT" --src-lang "$SRC" --tgt-lang "$TGT" \
            --out-prefix "$out/train" --summary "$out/train.summary.json"
    else
        train_docs_message "$raw" >&2
        die "the News Commentary v11 training documents are missing (see above)"
    fi
    ctx_check_splits "$out" "$SRC" "$TGT"
}

ctx_maruf_run "$SRC" "$TGT"
