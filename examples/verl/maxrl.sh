#!/usr/bin/env bash
# MaxRL (Tajwar et al. 2026, arXiv 2602.02710): (r - mean)/mean per group, 0/1 rewards.
REWARD=${REWARD:-accuracy}
source "$(dirname "$0")/recipe.sh"
run_recipe algorithm.adv_estimator=rlhf_ext_maxrl "$@"
