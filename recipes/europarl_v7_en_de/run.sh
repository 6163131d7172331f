#!/usr/bin/env bash
# Europarl v7 en-de, document-level (Maruf, Martins & Haffari, NAACL 2019,
# Sec. 4.1): a document is a speaker turn (the SPEAKER tag as the document
# delimiter, after Maruf and Haffari 2018), documents longer than 5 sentences
# kept, a random split into training, dev and test documents; Moses
# tokenisation and truecasing, joint BPE (30K merges), a 4-layer sentence-level
# Transformer, then the selective-attention document model initialised from it,
# sentence- and document-level BLEU, the paper's analyses. See README.md.
set -euo pipefail

RECIPE_NAME=europarl_v7_en_de
RECIPE_USAGE="usage: recipes/europarl_v7_en_de/run.sh [--workdir DIR] [--raw DIR] [--smoke] [--cpu]

  --raw DIR   the Europarl v7 documents, one of
                DIR/opus/de-en.xml.gz + DIR/opus/en.zip + DIR/opus/de.zip
                  (what the download step fetches: OPUS's sentence alignment of
                  Europarl v7 and its raw documents, with <SPEAKER> elements)
                DIR/sessions/en/ep-*.txt + DIR/sessions/de/ep-*.txt
                  (the source release's session files after its sentence aligner:
                  line-aligned, <CHAPTER>/<SPEAKER>/<P> lines at the same places)
  --smoke     every local step on DIR's few lines, tiny model, a few updates
Environment: INTEGRATION, DOC_CONTEXT, VARIANT (the model of Tables 2-3), BEAM,
VALID_SENTENCES [3600], TEST_SENTENCES [5100], MIN_DOC_SENTENCES [6], SPLIT_SEED [1],
MAX_TOKENS, BPE_MERGES, SEED, TRAIN_EXTRA, GEN_EXTRA, PYTHON (see README.md)."
# shellcheck source=SCRIPTDIR/../lib/recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/recipe.sh"
recipe_init "$@"

SRC=en
TGT=de
OPUS=${OPUS_URL:-https://object.pouta.csc.fi/OPUS-Europarl/v7}
if [ "$SMOKE" = 1 ]; then
    VALID_SENTENCES=${VALID_SENTENCES:-7}
    TEST_SENTENCES=${TEST_SENTENCES:-7}
else
    VALID_SENTENCES=${VALID_SENTENCES:-3600}
    TEST_SENTENCES=${TEST_SENTENCES:-5100}
fi
MIN_DOC_SENTENCES=${MIN_DOC_SENTENCES:-6}
SPLIT_SEED=${SPLIT_SEED:-1}
# the prep step reads them: its marker records them
RECIPE_SETTINGS+=(VALID_SENTENCES TEST_SENTENCES MIN_DOC_SENTENCES SPLIT_SEED)

# download: OPUS's Europarl v7 alignment (the links Maruf et al. used) and raw documents.
download() {
    local d="$WORK/raw/opus"
    fetch "$OPUS/xml/de-en.xml.gz" "$d/de-en.xml.gz"
    fetch "$OPUS/raw/en.zip" "$d/en.zip"
    fetch "$OPUS/raw/de.zip" "$d/de.zip"
}

# prep: speaker turns as documents, the short ones dropped, the random split.
prep() {
    local raw=${RAW:-$WORK/raw} split_args docs_args=() f lang
    split_args=(--src-lang "$SRC" --tgt-lang "$TGT" --min-doc-sentences "$MIN_DOC_SENTENCES"
                --out-dir "$WORK/docs" --valid-sentences "$VALID_SENTENCES"
                --test-sentences "$TEST_SENTENCES" --seed "$SPLIT_SEED"
                --summary "$WORK/docs.summary.json")
    if [ -d "$raw/sessions/$SRC" ]; then
        ctx_need "$raw/sessions/$TGT" "the $TGT session files"
        ctx_prep_corpora aligned-sessions --unit speaker --src-dir "$raw/sessions/$SRC" \
            --tgt-dir "$raw/sessions/$TGT" "${split_args[@]}"
    elif [ -e "$raw/opus/de-en.xml.gz" ] || [ -e "$raw/opus/de-en.xml" ]; then
        f="$raw/opus/de-en.xml.gz"
        [ -e "$f" ] || f="$raw/opus/de-en.xml"
        docs_args=(--docs "$raw/opus")
        for lang in "$SRC" "$TGT"; do
            if [ -e "$raw/opus/$lang.zip" ]; then docs_args+=(--docs "$raw/opus/$lang.zip"); fi
        done
        ctx_prep_corpora opus --alignment "$f" "${docs_args[@]}" --boundary-tag SPEAKER \
            --boundary-tag CHAPTER --group-depth 0 "${split_args[@]}"
    else
        die "$raw: neither sessions/$SRC/ nor opus/de-en.xml.gz (see --help and README.md)"
    fi
    ctx_check_splits "$WORK/docs" "$SRC" "$TGT"
}

ctx_maruf_run "$SRC" "$TGT"
