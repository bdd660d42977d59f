#!/usr/bin/env bash
# Complete Dr.GRPO (Liu et al. 2025, arXiv 2503.20783): group-mean baseline without the std division,
# and the loss summed over tokens and divided by a constant (max response length x sequences).
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator dr_grpo --actor.loss_agg_mode seq-mean-token-sum-norm "$@"
