#!/usr/bin/env bash
# Analytic Pass@k advantage (Chen et al. 2025, arXiv 2508.10751), k = 4 of the 8 samples; not
# verl's grpo_passk (a different method). Defined for 0/1 rewards: the reward is correctness alone.
REWARD=${REWARD:-accuracy}
source "$(dirname "$0")/recipe.sh"
run_recipe algorithm.adv_estimator=rlhf_ext_passk +algorithm.rlhf_ext.k=4 "$@"
