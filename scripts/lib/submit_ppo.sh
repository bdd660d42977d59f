#!/usr/bin/env bash
# Submit OpenRLHF's PPO/GRPO trainer with the rlhf_ext plugin as a Ray job; one script for both devices:
# submit_ppo.sh cuda|npu [options] -- ARGS (scripts/gpu/submit_ppo.sh and scripts/npu/submit_ppo.sh call it).
set -euo pipefail
# shellcheck source=scripts/lib/devices.sh
source "$(dirname "$0")/devices.sh" "${1:-}"
shift

print_help() {
  if [[ "$DEVICE" == npu ]]; then
    DEVICE_NOTE="The recipe's flags are the same as on
CUDA GPUs: --actor.num_gpus_per_node counts NPUs, and rlhf_ext retargets Ray resources, device
calls, weight sync (HCCL) and attention in every process of the job."
    PIN_NOTE="(the driver may run on a host without NPUs and must
not guess)"
  else
    DEVICE_NOTE="The recipe's flags are the same as on
an Ascend cluster (scripts/npu/submit_ppo.sh)."
    PIN_NOTE="(so a driver on a host without GPUs never guesses
CPU)"
  fi
  cat <<EOF_HELP
Usage: submit_ppo.sh [options] -- TRAIN_PPO_RAY_ARGS...

Submit \`python3 -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext TRAIN_PPO_RAY_ARGS...\` as a Ray job
to $CLUSTER_DESC started with scripts/$DEVICE_DIR/start_ray_cluster.sh. $DEVICE_NOTE

The job's runtime env pins RLHF_EXT_DEVICE=$DEVICE $PIN_NOTE and carries ${COMM_PREFIX}_*/GLOO_*/TP_* and other
rlhf_ext variables set in this shell.

Options:
  --address URL       Ray dashboard of the head node (default: \$RAY_DASHBOARD_ADDRESS or
                      http://127.0.0.1:8265, i.e. submit from the head node)
  --env NAME=VALUE    extra environment variable for every process of the job (repeatable)
  --working-dir DIR   ship DIR to the cluster as the job's working directory (reward files, data)
  --dry-run           print the ray job submit command instead of running it
  -h, --help          show this help

Example:
  scripts/$DEVICE_DIR/submit_ppo.sh -- \\
      --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --actor.num_nodes 2 --actor.num_gpus_per_node 8 \\
      --vllm.num_engines 4 --vllm.tensor_parallel_size 4 --train.colocate_all \\
      --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 ...
EOF_HELP
}

parse_submit_args 0 "$@"
submit_job "$DEVICE" python3 -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext "${JOB_ARGS[@]}"
