# Shared by scripts/npu/*.sh and scripts/gpu/*.sh: argument checks, the option parsing of
# start_ray_cluster.sh and submit_*.sh, and the Ray start / job-submit commands. Sourced, not run:
#   SCRIPT_NAME="$(basename "$0")"; source "$(dirname "$0")/../lib/cluster.sh"
# and the script defines print_help. Every check fails early with a message and a non-zero status:
# 2 for a wrong command line, 1 for a missing tool, file or variable.

die() { printf '%s: error: %s\n' "${SCRIPT_NAME:-cluster}" "$*" >&2; exit 1; }
usage_error() { printf '%s: error: %s (see --help)\n' "${SCRIPT_NAME:-cluster}" "$*" >&2; exit 2; }

require_value() {  # flag value: a flag that takes a value got one
  [[ -n "${2-}" && "${2-}" != --* ]] || usage_error "$1 needs a value"
}

require_cmd() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: $2"
}

require_positive_int() {  # name value
  [[ "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || usage_error "$1 must be a positive integer, got '$2'"
}

require_port() {  # name value
  [[ "$2" =~ ^[0-9]+$ && "$2" -ge 1 && "$2" -le 65535 ]] || usage_error "$1 must be a port number 1-65535, got '$2'"
}

require_host_port() {  # name value
  [[ "$2" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || usage_error "$1 must look like HOST:PORT (e.g. 10.0.0.1:6379), got '$2'"
  require_port "$1 port" "${2##*:}"
}

require_ipv4() {  # name value
  [[ "$2" =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}$ ]] || usage_error "$1 must be an IPv4 address, got '$2'"
}

require_ifname() {  # name value: the network interface must exist on this node
  [[ "$2" =~ ^[A-Za-z0-9._:-]+$ ]] || usage_error "$1 '$2' is not an interface name"
  if [[ -d /sys/class/net && ! -e "/sys/class/net/$2" ]]; then
    die "$1 '$2' is not a network interface of this node (have: $(ls /sys/class/net | tr '\n' ' '))"
  fi
}

require_env_assignment() {  # value of --env: NAME=VALUE
  [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || usage_error "--env expects NAME=VALUE, got '$1'"
}

# Export NAME=VALUE unless NAME is already set; remember it for the dry-run printout.
EXPORTED_VARS=()
export_default() {
  if [[ -z "${!1+x}" ]]; then
    export "$1=$2"
  fi
  EXPORTED_VARS+=("$1")
}

export_value() {
  export "$1=$2"
  EXPORTED_VARS+=("$1")
}

# Run a command, or with DRY_RUN=1 print the environment this script set and the command, quoted.
run_or_print() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    local name
    for name in "${EXPORTED_VARS[@]}"; do
      printf 'export %s=%q\n' "$name" "${!name}"
    done
    printf '%q ' "$@"
    printf '\n'
  else
    exec "$@"
  fi
}

# Shared option parsing of start_ray_cluster.sh. COUNT_FLAG (--npus or --gpus) is the option that
# gives this node's device count. Sets MODE (head|worker), ADDRESS, PORT, DEVICE_COUNT (empty: the
# script counts), IFNAME, NODE_IP and DRY_RUN, all checked. A script with options of its own lists
# them in START_VALUE_OPTIONS (e.g. "--cann-env") and defines start_option NAME VALUE to keep them.
parse_start_args() {  # COUNT_FLAG "$@"
  local count_flag="$1"
  shift
  [[ $# -gt 0 ]] || usage_error "say 'head' or 'worker'"
  case "$1" in
    -h|--help) print_help; exit 0 ;;
    head|worker) MODE="$1"; shift ;;
    *) usage_error "first argument must be 'head' or 'worker', got '$1'" ;;
  esac
  ADDRESS="" PORT=6379 DEVICE_COUNT="" IFNAME="" NODE_IP="" DRY_RUN=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) print_help; exit 0 ;;
      --address) require_value "$1" "${2-}"; ADDRESS="$2"; shift 2 ;;
      --port) require_value "$1" "${2-}"; PORT="$2"; shift 2 ;;
      "$count_flag") require_value "$1" "${2-}"; DEVICE_COUNT="$2"; shift 2 ;;
      --ifname) require_value "$1" "${2-}"; IFNAME="$2"; shift 2 ;;
      --node-ip) require_value "$1" "${2-}"; NODE_IP="$2"; shift 2 ;;
      --dry-run) DRY_RUN=1; shift ;;
      *)
        [[ " ${START_VALUE_OPTIONS-} " == *" $1 "* ]] || usage_error "unknown option '$1'"
        require_value "$1" "${2-}"; start_option "$1" "$2"; shift 2 ;;
    esac
  done

  if [[ "$MODE" == worker ]]; then
    [[ -n "$ADDRESS" ]] || usage_error "worker needs --address HEAD_IP:PORT"
    require_host_port --address "$ADDRESS"
  else
    [[ -z "$ADDRESS" ]] || usage_error "--address is for workers; the head listens on --port"
    require_port --port "$PORT"
  fi
  [[ -z "$DEVICE_COUNT" ]] || require_positive_int "$count_flag" "$DEVICE_COUNT"
  [[ -z "$IFNAME" ]] || require_ifname --ifname "$IFNAME"
  [[ -z "$NODE_IP" ]] || require_ipv4 --node-ip "$NODE_IP"
}

# --ifname for host traffic: the collective library's variable (HCCL_ or NCCL_SOCKET_IFNAME), gloo's
# and TensorPipe's.
export_socket_ifname() {  # HCCL|NCCL
  if [[ -n "$IFNAME" ]]; then
    export_value "$1_SOCKET_IFNAME" "$IFNAME"
    export_value GLOO_SOCKET_IFNAME "$IFNAME"
    export_value TP_SOCKET_IFNAME "$IFNAME"
  fi
}

# `ray start` for this node (head or worker, as parsed), declaring its devices with RESOURCE_ARG.
start_ray_node() {  # RESOURCE_ARG, e.g. --num-gpus=8
  require_cmd ray "activate the Python environment with Ray (pip install 'ray[default]') first"
  local cmd=(ray start "$1")
  if [[ "$MODE" == head ]]; then
    cmd+=(--head --port="$PORT")
  else
    cmd+=(--address="$ADDRESS")
  fi
  [[ -z "$NODE_IP" ]] || cmd+=(--node-ip-address="$NODE_IP")
  run_or_print "${cmd[@]}"
}

# JSON for `ray job submit --runtime-env-json`: {"env_vars": {...}} from NAME=VALUE arguments,
# plus "working_dir" when RUNTIME_WORKING_DIR is set. Python does the quoting.
runtime_env_json() {
  python3 - "$@" <<'PY'
import json, os, sys
env = dict(item.split("=", 1) for item in sys.argv[1:])
spec = {"env_vars": env}
if os.environ.get("RUNTIME_WORKING_DIR"):
    spec["working_dir"] = os.environ["RUNTIME_WORKING_DIR"]
print(json.dumps(spec, sort_keys=True))
PY
}

# Variables worth carrying from the submitting shell into every process of a job, when set there.
PASS_THROUGH_VARS=(
  HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT HCCL_IF_IP HCCL_SOCKET_IFNAME HCCL_BUFFSIZE HCCL_IF_BASE_PORT
  GLOO_SOCKET_IFNAME TP_SOCKET_IFNAME NCCL_SOCKET_IFNAME NCCL_DEBUG PYTORCH_NPU_ALLOC_CONF TASK_QUEUE_ENABLE
  RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
  RLHF_EXT_ATTN_IMPLEMENTATION RLHF_EXT_HCCL_DEFAULTS RLHF_EXT_PLUGINS HF_HOME HF_ENDPOINT
)

# Shared job-submission argument parsing for submit_*.sh. Sets: JOB_ADDRESS, JOB_ENV (array of
# NAME=VALUE), JOB_ARGS (the entrypoint's own arguments), DRY_RUN, RUNTIME_WORKING_DIR, and for
# evalkit (takes_dp=1) DP and EVAL_MODULE.
parse_submit_args() {  # takes_dp(0|1) "$@"
  local takes_dp="$1"
  shift
  JOB_ADDRESS="${RAY_DASHBOARD_ADDRESS:-http://127.0.0.1:8265}"
  JOB_ENV=()
  JOB_ARGS=()
  DP=""
  EVAL_MODULE="rlhf_ext.evalkit"
  DRY_RUN=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) print_help; exit 0 ;;
      --address) require_value "$1" "${2-}"; JOB_ADDRESS="$2"; shift 2 ;;
      --env) require_value "$1" "${2-}"; require_env_assignment "$2"; JOB_ENV+=("$2"); shift 2 ;;
      --working-dir)
        require_value "$1" "${2-}"
        [[ -d "$2" ]] || die "--working-dir '$2' is not a directory"
        RUNTIME_WORKING_DIR="$2"; export RUNTIME_WORKING_DIR; shift 2 ;;
      --dp)
        [[ "$takes_dp" == 1 ]] || usage_error "unknown option --dp"
        require_value "$1" "${2-}"; require_positive_int --dp "$2"; DP="$2"; shift 2 ;;
      --module)
        [[ "$takes_dp" == 1 ]] || usage_error "unknown option --module"
        require_value "$1" "${2-}"
        [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || usage_error "--module must be a Python module name, got '$2'"
        EVAL_MODULE="$2"; shift 2 ;;
      --dry-run) DRY_RUN=1; shift ;;
      --) shift; JOB_ARGS=("$@"); break ;;
      *) usage_error "unknown option '$1'; put the job's own arguments after --" ;;
    esac
  done
  [[ "$JOB_ADDRESS" =~ ^https?://[A-Za-z0-9._-]+:[0-9]+/?$ ]] \
    || usage_error "--address must be the Ray dashboard URL, like http://10.0.0.1:8265, got '$JOB_ADDRESS'"
  if [[ "$takes_dp" == 1 && -z "$DP" ]]; then usage_error "--dp (number of data-parallel vLLM engines) is required"; fi
  [[ ${#JOB_ARGS[@]} -gt 0 ]] || usage_error "no arguments for the job after --"
  require_cmd ray "install Ray in this environment (pip install 'ray[default]'), or run where the cluster was started"
  require_cmd python3 "needed to build the job's runtime-env JSON"
}

# The job's env vars: the backend pin, what the caller exported, then --env overrides.
collect_job_env() {  # backend
  local out=("RLHF_EXT_DEVICE=$1") name
  for name in "${PASS_THROUGH_VARS[@]}"; do
    if [[ -n "${!name-}" ]]; then out+=("$name=${!name}"); fi
  done
  out+=("${JOB_ENV[@]}")
  JOB_ENV=("${out[@]}")
}

# Submit ENTRYPOINT... as a Ray job with what parse_submit_args read, the job's environment pinned to
# BACKEND (RLHF_EXT_DEVICE) plus the pass-through variables and --env.
submit_job() {  # BACKEND ENTRYPOINT...
  collect_job_env "$1"
  shift
  run_or_print ray job submit --address="$JOB_ADDRESS" \
    --runtime-env-json="$(runtime_env_json "${JOB_ENV[@]}")" \
    -- "$@"
}
