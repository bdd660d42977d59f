#!/usr/bin/env bash
# Start a MindSpeed-RL 2.1 training run with the rlhf_ext plugin on an Ascend node.
set -euo pipefail
SCRIPT_NAME="$(basename "$0")"
# shellcheck source=scripts/lib/cluster.sh
source "$(dirname "$0")/../lib/cluster.sh"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"

print_help() {
  cat <<'EOF_HELP'
Usage: train_mindspeed_rl.sh --mindspeed-rl DIR [options] -- [HYDRA_OVERRIDES...]

Run MindSpeed-RL's own trainer, unmodified, with `--plugin rlhf_ext`:
  cd DIR && python3 cli/train_ALGO.py --config-dir CONFIG_DIR --config-name NAME --plugin rlhf_ext OVERRIDES...
on the head node of a Ray cluster (scripts/npu/start_ray_cluster.sh), or on a single node, where
MindSpeed-RL starts Ray itself. The rl_config values are checked before Ray starts (exit code 2).

Options:
  --mindspeed-rl DIR    MindSpeed-RL checkout (with Megatron-LM, MindSpeed, MindSpeed-LLM beside it,
                        as MindSpeed-RL's install guide sets up); required
  --algo ALGO           grpo (default), dapo or ppo: which cli/train_ALGO.py runs
  --config-name NAME    Hydra config (default: drgrpo_qwen25_7b_A3)
  --config-dir DIR      extra Hydra config directory (default: rlhf_ext's examples/mindspeed_rl,
                        whose configs extend MindSpeed-RL's grpo_qwen25_7b_A3 by one switch each)
  --cann-env FILE       CANN set_env.sh to source (default: $ASCEND_SET_ENV or
                        /usr/local/Ascend/ascend-toolkit/set_env.sh)
  --dry-run             print the environment and the command instead of running it
  -h, --help            show this help

Example (Dr.GRPO on Qwen2.5-7B with MindSpeed-RL's GRPO recipe; paths are Hydra overrides):
  scripts/npu/train_mindspeed_rl.sh --mindspeed-rl ~/MindSpeed-RL --config-name drgrpo_qwen25_7b_A3 -- \
      megatron_training.tokenizer_name_or_path=/models/Qwen2.5-7B megatron_training.data_path=/data/math
EOF_HELP
}

MS_DIR=""
ALGO="grpo"
CONFIG_NAME="drgrpo_qwen25_7b_A3"
CONFIG_DIR="$REPO/examples/mindspeed_rl"
CANN_ENV="${ASCEND_SET_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}"
DRY_RUN=0
OVERRIDES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) print_help; exit 0 ;;
    --mindspeed-rl) require_value "$1" "${2-}"; MS_DIR="$2"; shift 2 ;;
    --algo) require_value "$1" "${2-}"; ALGO="$2"; shift 2 ;;
    --config-name) require_value "$1" "${2-}"; CONFIG_NAME="$2"; shift 2 ;;
    --config-dir) require_value "$1" "${2-}"; CONFIG_DIR="$2"; shift 2 ;;
    --cann-env) require_value "$1" "${2-}"; CANN_ENV="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) usage_error "unknown option '$1'; put Hydra overrides after --" ;;
  esac
done

[[ -n "$MS_DIR" ]] || usage_error "--mindspeed-rl DIR (the MindSpeed-RL checkout) is required"
[[ "$ALGO" =~ ^(grpo|dapo|ppo)$ ]] || usage_error "--algo must be grpo, dapo or ppo, got '$ALGO'"
[[ "$CONFIG_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || usage_error "--config-name must be a config name without .yaml, got '$CONFIG_NAME'"
[[ -d "$MS_DIR/mindspeed_rl" && -f "$MS_DIR/cli/train_$ALGO.py" ]] \
  || die "--mindspeed-rl '$MS_DIR' is not a MindSpeed-RL checkout (no mindspeed_rl/ or cli/train_$ALGO.py)"
MS_DIR="$(cd "$MS_DIR" && pwd)"
[[ -d "$CONFIG_DIR" ]] || die "--config-dir '$CONFIG_DIR' is not a directory"
CONFIG_DIR="$(cd "$CONFIG_DIR" && pwd)"
[[ -f "$CONFIG_DIR/$CONFIG_NAME.yaml" || -f "$MS_DIR/configs/$CONFIG_NAME.yaml" ]] \
  || die "config '$CONFIG_NAME.yaml' is in neither $CONFIG_DIR nor $MS_DIR/configs"
for arg in "${OVERRIDES[@]}"; do
  [[ "$arg" != --plugin* ]] || usage_error "the script adds --plugin rlhf_ext itself; drop '$arg'"
done
require_cmd python3 "install Python 3 with MindSpeed-RL's requirements"

if [[ "$DRY_RUN" != 1 ]]; then
  [[ -f "$CANN_ENV" ]] || die "CANN environment script '$CANN_ENV' not found: install the CANN toolkit, or pass --cann-env / set ASCEND_SET_ENV"
  set +u  # CANN's script reads variables that may be unset
  # shellcheck disable=SC1090
  source "$CANN_ENV"
  set -u
  python3 -c 'import rlhf_ext' 2>/dev/null || die "rlhf_ext is not installed for python3 (pip install --no-deps -e $REPO)"
fi
export_default PYTORCH_NPU_ALLOC_CONF "expandable_segments:True"
export_value PYTHONPATH "$MS_DIR${PYTHONPATH:+:$PYTHONPATH}"
cd "$MS_DIR"
run_or_print python3 "$MS_DIR/cli/train_$ALGO.py" --config-dir "$CONFIG_DIR" --config-name "$CONFIG_NAME" --plugin rlhf_ext \
  "${OVERRIDES[@]}"
