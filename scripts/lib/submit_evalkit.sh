#!/usr/bin/env bash
# Submit an rlhf_ext evalkit run with --dp data-parallel vLLM engines as a Ray job; one script for both
# devices: submit_evalkit.sh cuda|npu --dp N [options] -- ARGS (scripts/gpu/ and scripts/npu/ call it).
set -euo pipefail
# shellcheck source=scripts/lib/devices.sh
source "$(dirname "$0")/devices.sh" "${1:-}"
shift

print_help() {
  local engines="N vLLM engines"
  [[ "$DEVICE" == npu ]] && engines="N vLLM engines (vllm-ascend)"
  cat <<EOF_HELP
Usage: submit_evalkit.sh --dp N [options] -- EVALKIT_ARGS...

Submit \`python3 -m rlhf_ext.evalkit --dp N EVALKIT_ARGS...\` (see --module) as a Ray job to
$CLUSTER_DESC started with scripts/$DEVICE_DIR/start_ray_cluster.sh: $engines, one $DEVICE_UNIT each,
evaluate shards of the benchmark in parallel. The job's runtime env pins RLHF_EXT_DEVICE=$DEVICE and
carries ${COMM_PREFIX}_*/GLOO_*/TP_* and other rlhf_ext variables set in this shell.

Options:
  --dp N              number of data-parallel vLLM engines (required; at most the cluster's ${DEVICE_UNIT}s)
  --address URL       Ray dashboard of the head node (default: \$RAY_DASHBOARD_ADDRESS or
                      http://127.0.0.1:8265)
  --env NAME=VALUE    extra environment variable for every process of the job (repeatable)
  --working-dir DIR   ship DIR to the cluster as the job's working directory
  --module NAME       the evalkit entry module (default rlhf_ext.evalkit)
  --dry-run           print the ray job submit command instead of running it
  -h, --help          show this help

Example:
  scripts/$DEVICE_DIR/submit_evalkit.sh --dp 8 -- math500 --model /models/my-checkpoint --n-samples 4
EOF_HELP
}

parse_submit_args 1 "$@"
# evalkit reads its first word as the task (math500, aime, run, ...): --dp goes after it
(( ${#JOB_ARGS[@]} > 0 )) && [[ "${JOB_ARGS[0]}" != -* ]] \
  || usage_error "name the evalkit task after --, e.g. -- math500 --model /models/my-checkpoint"
submit_job "$DEVICE" python3 -m "$EVAL_MODULE" "${JOB_ARGS[0]}" --dp "$DP" "${JOB_ARGS[@]:1}"
