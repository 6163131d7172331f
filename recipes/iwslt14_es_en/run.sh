#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# IWSLT14 Spanish<->English, the DC paper (Ampomah et al. 2021), Table 2:
# Transformer, Enc-DC, Dec-DC and Full-DC in both directions. See README.md.
#
#   bash recipes/iwslt14_es_en/run.sh [--workdir DIR] [--raw DIR] [--cpu]
#   bash recipes/iwslt14_es_en/run.sh --smoke --raw SAMPLE_DIR
# Environment: MODELS ("transformer enc-dc dec-dc full-dc"), DIRECTIONS
# ("es-en en-es"), TRAIN_EXTRA, GEN_EXTRA, PYTHON.
set -euo pipefail

RECIPE_NAME=iwslt14_es_en
# shellcheck source=../lib/recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/recipe.sh"
# Sec. 5.1: a shared vocabulary of 34k subword tokens (merge operations: see
# README); validation = tst2010 + tst2011 + tst2012 + dev2010, test = tst2014
sent_dc_wit3_run es Spanish 2014 34000 "tst2010 tst2011 tst2012 dev2010" "tst2014" "$@"
