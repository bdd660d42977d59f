#!/usr/bin/env bash
# Start one node of a Ray cluster on an NVIDIA GPU machine (run it on every node: head first).
set -euo pipefail
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/npu/_cluster_lib.sh
source "$(dirname "$0")/../npu/_cluster_lib.sh"

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

[[ $# -gt 0 ]] || usage_error "say 'head' or 'worker'"
case "$1" in
  -h|--help) print_help; exit 0 ;;
  head|worker) MODE="$1"; shift ;;
  *) usage_error "first argument must be 'head' or 'worker', got '$1'" ;;
esac

ADDRESS="" PORT=6379 GPUS="" IFNAME="" NODE_IP="" DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) print_help; exit 0 ;;
    --address) require_value "$1" "${2-}"; ADDRESS="$2"; shift 2 ;;
    --port) require_value "$1" "${2-}"; PORT="$2"; shift 2 ;;
    --gpus) require_value "$1" "${2-}"; GPUS="$2"; shift 2 ;;
    --ifname) require_value "$1" "${2-}"; IFNAME="$2"; shift 2 ;;
    --node-ip) require_value "$1" "${2-}"; NODE_IP="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) usage_error "unknown option '$1'" ;;
  esac
done

if [[ "$MODE" == worker ]]; then
  [[ -n "$ADDRESS" ]] || usage_error "worker needs --address HEAD_IP:PORT"
  require_host_port --address "$ADDRESS"
else
  [[ -z "$ADDRESS" ]] || usage_error "--address is for workers; the head listens on --port"
  require_port --port "$PORT"
fi
[[ -z "$GPUS" ]] || require_positive_int --gpus "$GPUS"
[[ -z "$IFNAME" ]] || require_ifname --ifname "$IFNAME"
[[ -z "$NODE_IP" ]] || require_ipv4 --node-ip "$NODE_IP"

if [[ -z "$GPUS" ]]; then
  require_cmd nvidia-smi "install the NVIDIA driver, or pass --gpus N"
  GPUS=$(nvidia-smi -L | grep -c '^GPU ' || true)
  [[ "$GPUS" -gt 0 ]] || die "nvidia-smi lists no GPUs on this node (or pass --gpus N)"
fi
require_positive_int --gpus "$GPUS"

export_value RLHF_EXT_DEVICE cuda
if [[ -n "$IFNAME" ]]; then
  export_value NCCL_SOCKET_IFNAME "$IFNAME"
  export_value GLOO_SOCKET_IFNAME "$IFNAME"
  export_value TP_SOCKET_IFNAME "$IFNAME"
fi

require_cmd ray "activate the Python environment with Ray (pip install 'ray[default]') first"
cmd=(ray start --num-gpus="$GPUS")
if [[ "$MODE" == head ]]; then
  cmd+=(--head --port="$PORT")
else
  cmd+=(--address="$ADDRESS")
fi
[[ -z "$NODE_IP" ]] || cmd+=(--node-ip-address="$NODE_IP")
run_or_print "${cmd[@]}"
