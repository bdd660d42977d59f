#!/usr/bin/env bash
# Complete Dr.GRPO (Liu et al. 2025, arXiv 2503.20783) with rlhf_ext's math reward: group-mean
# baseline without the std division (rlhf_ext_dr_grpo), and the loss summed over tokens and divided
# by a constant, verl's seq-mean-token-sum-norm with the generation budget (1024) as the constant.
source "$(dirname "$0")/recipe.sh"
run_recipe algorithm.adv_estimator=rlhf_ext_dr_grpo \
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
  actor_rollout_ref.actor.loss_scale_factor=1024 "$@"
