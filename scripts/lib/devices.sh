# Sourced first by the job scripts of scripts/lib (one script for both devices), with the device as its
# argument: sets SCRIPT_NAME, loads cluster.sh, and sets DEVICE (cuda|npu) and the words that differ
# between a CUDA GPU cluster and an Ascend NPU one. The script then shifts the device off "$@".
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/lib/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
case "${1:-}" in
  cuda) DEVICE=cuda; DEVICE_DIR=gpu; CLUSTER_DESC="a CUDA GPU cluster"; DEVICE_UNIT=GPU; COMM_PREFIX=NCCL ;;
  npu) DEVICE=npu; DEVICE_DIR=npu; CLUSTER_DESC="an Ascend cluster"; DEVICE_UNIT=NPU; COMM_PREFIX=HCCL ;;
  *) printf '%s: error: first argument must be the device, cuda or npu (got %q)\n' "$(basename "$0")" "${1:-}" >&2
     exit 2 ;;
esac
