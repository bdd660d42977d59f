#!/usr/bin/env bash
# Submit an rlhf_ext evalkit run with --dp data-parallel vLLM engines as a Ray job on an Ascend cluster.
set -euo pipefail
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/lib/cluster.sh
source "$(dirname "$0")/../lib/cluster.sh"

print_help() {
  cat <<'EOF_HELP'
Usage: submit_evalkit.sh --dp N [options] -- EVALKIT_ARGS...

Submit `python3 -m rlhf_ext.evalkit --dp N EVALKIT_ARGS...` (see --module) as a Ray job to a cluster started with
scripts/npu/start_ray_cluster.sh: N vLLM engines (vllm-ascend), one NPU each, evaluate shards of
the benchmark in parallel. The job's runtime env pins RLHF_EXT_DEVICE=npu and carries
HCCL_*/GLOO_*/TP_* and other rlhf_ext variables set in this shell.

Options:
  --dp N              number of data-parallel vLLM engines (required; at most the cluster's NPUs)
  --address URL       Ray dashboard of the head node (default: $RAY_DASHBOARD_ADDRESS or
                      http://127.0.0.1:8265)
  --env NAME=VALUE    extra environment variable for every process of the job (repeatable)
  --working-dir DIR   ship DIR to the cluster as the job's working directory
  --module NAME       the evalkit entry module (default rlhf_ext.evalkit)
  --dry-run           print the ray job submit command instead of running it
  -h, --help          show this help

Example:
  scripts/npu/submit_evalkit.sh --dp 8 -- --model /models/my-checkpoint --benchmarks math500,aime24
EOF_HELP
}

parse_submit_args 1 "$@"
submit_job npu python3 -m "$EVAL_MODULE" --dp "$DP" "${JOB_ARGS[@]}"
