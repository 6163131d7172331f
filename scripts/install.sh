#!/usr/bin/env bash
# Installs ctx-fairseq and its dependencies into the active Python environment.
#   bash scripts/install.sh
# Environment: PYTHON (default: python), TORCH_SPEC (default: torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# 1. torch. An existing install (e.g. a CUDA build on a GPU machine) is kept.
#    Otherwise install the pinned version; on our CPU machines pip finds the
#    local CPU wheel for it, so no CUDA build is downloaded.
if "$PY" -c "import torch" 2>/dev/null; then
  echo "install.sh: keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  "$PY" -m pip install "$TORCH_SPEC"
fi

# 2. fairseq: the ve-fairseq fork (binary wheels for CPython 3.11 and 3.12,
#    import name "fairseq"), without its torchaudio requirement.
"$PY" -m pip install --no-deps "ve-fairseq==0.12.3"

# 3. this package, its requirements and fairseq's runtime requirements.
"$PY" -m pip install -e ".[test]"

"$PY" -c "import ctx_fairseq, fairseq, torch; print('install.sh: ctx_fairseq', ctx_fairseq.__version__, '| fairseq', fairseq.__version__, '| torch', torch.__version__)"
