#!/usr/bin/env bash
# One short check of rlhf_ext on a CUDA GPU (under 8 minutes): every registered estimator, policy loss,
# aggregation mode, KL estimator and rollout-correction mode on GPU tensors at 512 x 8 x 4096 against the
# CPU, and the cost of the non-finite guard and the step metrics on a bf16 Qwen2-shaped ~0.5B model
# (step time and host syncs). Needs PyTorch and transformers only.
#
# Usage: bash scripts/gpu/device_check.sh [--cpu] [--json PATH] [--budget SECONDS] [other device_check.py flags]
#   JSON defaults to $OUT/device_check.json when $OUT is set, else ./device_check.json; it is rewritten
#   after every result, so a run cut short still leaves what it measured. PYTHON=... picks the interpreter.
#   The whole run is killed after $DEVICE_CHECK_HARD_LIMIT seconds (default 470) whatever happens.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LIMIT=${DEVICE_CHECK_HARD_LIMIT:-470}
JSON="${OUT:-.}/device_check.json"
for arg in "$@"; do
  case "$arg" in --json|--json=*) JSON="";; esac
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
fi
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "| transformers", transformers.__version__)' \
  || { echo "device_check: PyTorch and transformers must be importable with $PY" >&2; exit 2; }
args=("$@")
[ -n "$JSON" ] && args+=(--json "$JSON")
timeout -k 10 "$LIMIT" "$PY" benchmarks/device_check.py "${args[@]}"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "device_check: killed after ${LIMIT}s; the JSON holds the results measured until then" >&2
fi
exit "$rc"
