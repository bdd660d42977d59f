#!/usr/bin/env bash
# Start one node of a Ray cluster on an NVIDIA GPU machine (run it on every node: head first).
set -euo pipefail
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/lib/cluster.sh
source "$(dirname "$0")/../lib/cluster.sh"

print_help() {
  cat <<'EOF_HELP'
Usage: start_ray_cluster.sh head   [options]
       start_ray_cluster.sh worker --address HEAD_IP:PORT [options]

Start a Ray node on a CUDA GPU machine for OpenRLHF + rlhf_ext jobs: the CUDA counterpart of
scripts/npu/start_ray_cluster.sh, with the same options and the same job scripts.
  1. counts the GPUs with nvidia-smi unless --gpus is given;
  2. exports NCCL/gloo/TensorPipe interface variables (--ifname) and RLHF_EXT_DEVICE=cuda;
  3. runs `ray start ... --num-gpus=N`.

Options:
  --address HOST:PORT   head node's Ray address (worker only), e.g. 10.0.0.1:6379
  --port PORT           head node's Ray port (head only, default 6379)
  --gpus N              GPUs to offer on this node (default: `nvidia-smi -L` count)
  --ifname IF           network interface for NCCL/gloo/TensorPipe host traffic
                        (sets NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME)
  --node-ip IP          this node's IP (Ray's --node-ip-address)
  --dry-run             print the environment and the ray command instead of running it
  -h, --help            show this help
EOF_HELP
}

parse_start_args --gpus "$@"
GPUS="$DEVICE_COUNT"

if [[ -z "$GPUS" ]]; then
  require_cmd nvidia-smi "install the NVIDIA driver, or pass --gpus N"
  GPUS=$(nvidia-smi -L | grep -c '^GPU ' || true)
  [[ "$GPUS" -gt 0 ]] || die "nvidia-smi lists no GPUs on this node (or pass --gpus N)"
fi
require_positive_int --gpus "$GPUS"

export_value RLHF_EXT_DEVICE cuda
export_socket_ifname NCCL
start_ray_node --num-gpus="$GPUS"
