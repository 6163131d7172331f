#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# IWSLT15 French<->English, the DC paper (Ampomah et al. 2021), Table 2:
# Transformer, Enc-DC, Dec-DC and Full-DC in both directions. See README.md.
#
#   bash recipes/iwslt15_fr_en/run.sh [--workdir DIR] [--raw DIR] [--cpu]
#   bash recipes/iwslt15_fr_en/run.sh --smoke --raw SAMPLE_DIR
# Environment: MODELS ("transformer enc-dc dec-dc full-dc"), DIRECTIONS
# ("fr-en en-fr"), TRAIN_EXTRA, GEN_EXTRA, PYTHON.
set -euo pipefail

RECIPE_NAME=iwslt15_fr_en
# shellcheck source=../lib/recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/recipe.sh"
# Sec. 5.1: a shared vocabulary of 31k subword tokens (merge operations: see
# README); validation = tst2013, test = tst2014 + tst2015
sent_dc_wit3_run fr French 2015 31000 "tst2013" "tst2014 tst2015" "$@"
