#!/usr/bin/env bash
# GSPO (Zheng et al. 2025, arXiv 2507.18071): GRPO's group advantages with a length-normalised
# sequence ratio and the paper's tiny clip range, averaged per sequence.
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator grpo --actor.policy_loss_type gspo --actor.loss_agg_mode seq-mean-token-mean \
  --actor.eps_clip_low_high 3e-4 4e-4 "$@"
