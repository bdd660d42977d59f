#!/usr/bin/env bash
# Async GRPO with staleness-aware objectives: AReaL's decoupled PPO (arXiv 2505.24298; the proximal policy
# interpolated log-linearly between the behaviour and the current one, no extra forward pass) and M2PO
# (mask the tokens with the largest squared log-ratio until the batch's second moment is under 0.04),
# plus Skywork-OR1's adaptive entropy bonus (arXiv 2505.22312). Samples are at most one policy version old
# (OpenRLHF's async queue of 1 batch); rlhf_ext/policy_lag is logged per step.
PLACEMENT=split  # async needs vLLM generating while the actor trains: no colocation, no sleep
source "$(dirname "$0")/recipe.sh"
run_recipe --algo.advantage.estimator grpo --train.async_enable \
  --rlhf_ext.decoupled_loss --rlhf_ext.prox_logp loglinear --rlhf_ext.m2po_threshold 0.04 \
  --actor.entropy_coef 0 --rlhf_ext.adaptive_entropy --rlhf_ext.entropy_target 0.2 "$@"
