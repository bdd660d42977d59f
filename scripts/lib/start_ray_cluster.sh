#!/usr/bin/env bash
# Start one node of a Ray cluster (run it on every node: head first); one script for both devices:
# start_ray_cluster.sh cuda|npu head|worker [options] (scripts/gpu/ and scripts/npu/ call it).
set -euo pipefail
# shellcheck source=scripts/lib/devices.sh
source "$(dirname "$0")/devices.sh" "${1:-}"
shift

print_help() {
  if [[ "$DEVICE" == npu ]]; then
    cat <<'EOF_HELP'
Usage: start_ray_cluster.sh head   [options]
       start_ray_cluster.sh worker --address HEAD_IP:PORT [options]

Start a Ray node on an Ascend NPU machine so that OpenRLHF + rlhf_ext jobs can use its NPUs.
What it does, in order:
  1. sources CANN's set_env.sh (torch_npu and HCCL need it; checks ASCEND_HOME_PATH afterwards);
  2. counts the NPUs (/dev/davinci0..N) unless --npus is given;
  3. exports the network-interface variables for HCCL, gloo and TensorPipe (--ifname),
     RLHF_EXT_DEVICE=npu and rlhf_ext's HCCL defaults (any variable you already set wins);
  4. runs `ray start ... --resources='{"NPU": N}'`: Ray's own NPU detection needs CANN's Python
     `acl` module and can undercount, so the count is always declared.
Ray processes inherit this environment, so every job and actor on the node sees CANN and HCCL.

Options:
  --address HOST:PORT   head node's Ray address (worker only), e.g. 10.0.0.1:6379
  --port PORT           head node's Ray port (head only, default 6379)
  --npus N              NPUs to offer on this node (default: count of /dev/davinci[0-9]*)
  --cann-env FILE       CANN set_env.sh (default: $ASCEND_SET_ENV or
                        /usr/local/Ascend/ascend-toolkit/set_env.sh)
  --ifname IF           network interface for HCCL/gloo/TensorPipe host traffic
                        (sets HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME)
  --node-ip IP          this node's IP on that network (sets HCCL_IF_IP and Ray's --node-ip-address)
  --dry-run             print the environment and the ray command instead of running it
  -h, --help            show this help

Example (two 8-NPU nodes):
  head$   scripts/npu/start_ray_cluster.sh head --ifname eth0 --node-ip 10.0.0.1
  worker$ scripts/npu/start_ray_cluster.sh worker --address 10.0.0.1:6379 --ifname eth0 --node-ip 10.0.0.2
  head$   scripts/npu/submit_ppo.sh -- --actor.model_name_or_path ... (see submit_ppo.sh --help)
EOF_HELP
  else
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
  fi
}

if [[ "$DEVICE" == npu ]]; then
  CANN_ENV="${ASCEND_SET_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}"
  START_VALUE_OPTIONS="--cann-env"
  start_option() { CANN_ENV="$2"; }  # --cann-env FILE
  parse_start_args --npus "$@"
  NPUS="$DEVICE_COUNT"

  # 1. CANN
  [[ -f "$CANN_ENV" ]] || die "CANN environment script '$CANN_ENV' not found: install the CANN toolkit, or pass --cann-env / set ASCEND_SET_ENV to your set_env.sh"
  set +u  # CANN's script reads variables that may be unset
  # shellcheck disable=SC1090
  source "$CANN_ENV"
  set -u
  [[ -n "${ASCEND_HOME_PATH:-}" ]] || die "sourcing '$CANN_ENV' did not set ASCEND_HOME_PATH: is it CANN's set_env.sh?"

  # 2. NPU count
  if [[ -z "$NPUS" ]]; then
    DEV_DIR="${RLHF_EXT_DEV_DIR:-/dev}"  # overridable for tests
    shopt -s nullglob
    devices=("$DEV_DIR"/davinci[0-9]*)
    shopt -u nullglob
    NPUS=${#devices[@]}
    [[ "$NPUS" -gt 0 ]] || die "no $DEV_DIR/davinci* devices on this node: is the Ascend driver installed? (or pass --npus N)"
  fi
  require_positive_int --npus "$NPUS"

  # 3. Environment inherited by Ray and every process it starts.
  export_value RLHF_EXT_DEVICE npu
  export_socket_ifname HCCL
  [[ -z "$NODE_IP" ]] || export_value HCCL_IF_IP "$NODE_IP"
  export_default HCCL_CONNECT_TIMEOUT 1800
  export_default HCCL_EXEC_TIMEOUT 3600
  export_default PYTORCH_NPU_ALLOC_CONF expandable_segments:True
  export_default VLLM_WORKER_MULTIPROC_METHOD spawn

  # 4. Ray
  start_ray_node --resources="{\"NPU\": $NPUS}"
else
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
fi
