#!/usr/bin/env bash
# Submit OpenRLHF's PPO/GRPO trainer with the rlhf_ext plugin as a Ray job on an Ascend cluster
# (scripts/lib/submit_ppo.sh, one script for both devices; --help for the options).
set -euo pipefail
exec bash "$(dirname "$0")/../lib/submit_ppo.sh" npu "$@"
