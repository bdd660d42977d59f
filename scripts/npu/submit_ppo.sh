#!/usr/bin/env bash
# Submit OpenRLHF's PPO/GRPO trainer with the rlhf_ext plugin as a Ray job on an Ascend cluster.
set -euo pipefail
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/lib/cluster.sh
source "$(dirname "$0")/../lib/cluster.sh"

print_help() {
  cat <<'EOF_HELP'
Usage: submit_ppo.sh [options] -- TRAIN_PPO_RAY_ARGS...

Submit `python3 -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext TRAIN_PPO_RAY_ARGS...` as a Ray job
to a cluster started with scripts/npu/start_ray_cluster.sh. The recipe's flags are the same as on
CUDA GPUs: --actor.num_gpus_per_node counts NPUs, and rlhf_ext retargets Ray resources, device
calls, weight sync (HCCL) and attention in every process of the job.

The job's runtime env pins RLHF_EXT_DEVICE=npu (the driver may run on a host without NPUs and must
not guess) and carries HCCL_*/GLOO_*/TP_* and other rlhf_ext variables set in this shell.

Options:
  --address URL       Ray dashboard of the head node (default: $RAY_DASHBOARD_ADDRESS or
                      http://127.0.0.1:8265, i.e. submit from the head node)
  --env NAME=VALUE    extra environment variable for every process of the job (repeatable)
  --working-dir DIR   ship DIR to the cluster as the job's working directory (reward files, data)
  --dry-run           print the ray job submit command instead of running it
  -h, --help          show this help

Example:
  scripts/npu/submit_ppo.sh -- \
      --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --actor.num_nodes 2 --actor.num_gpus_per_node 8 \
      --vllm.num_engines 4 --vllm.tensor_parallel_size 4 --train.colocate_all \
      --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 ...
EOF_HELP
}

parse_submit_args 0 "$@"
submit_job npu python3 -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext "${JOB_ARGS[@]}"
