#!/usr/bin/env bash
# Dr.GRPO on one Ascend node (8 NPUs) through verl's own NPU support (trainer.device=npu, vllm-ascend
# rollouts). Needs CANN, torch_npu and vllm-ascend as verl's Ascend install guide sets them up;
# rlhf_ext adds nothing device-specific here (its estimators and losses are plain torch).
# Source CANN first, e.g.: source /usr/local/Ascend/ascend-toolkit/set_env.sh
export RUN_NAME=${RUN_NAME:-dr_grpo_npu}
export DEVICE=npu
source "$(dirname "$0")/recipe.sh"
run_recipe algorithm.adv_estimator=rlhf_ext_dr_grpo \
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
  actor_rollout_ref.actor.loss_scale_factor=1024 \
  actor_rollout_ref.actor.use_torch_compile=False \
  actor_rollout_ref.rollout.enforce_eager=True "$@"
