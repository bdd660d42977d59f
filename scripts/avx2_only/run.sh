#!/usr/bin/env bash
# Run a command as on an AVX2-only CPU (no AVX-512, no AMX): see sitecustomize.py beside this file.
#   bash scripts/avx2_only/run.sh .venv/bin/python -m pytest -q tests/test_vllm_cpu_weights.py
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export RLHF_EXT_AVX2_ONLY=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
