#!/usr/bin/env bash
# The one recipe every verl example shares: Qwen2.5-Math-1.5B on GSM8K with verl 0.9.x's GRPO
# setup (FSDP actor, vLLM rollouts, 8 samples per prompt, no KL term), rlhf_ext's math reward
# through verl's custom_reward_function, on one 8-GPU node. Each algorithm script sources this file
# and calls `run_recipe` with its switch only, so runs differ in nothing else. The rlhf_ext plugin
# is active because rlhf_ext is installed: verl loads its `verl.plugins` entry point itself.
#
# Settings (environment):
#   MODEL   model path or hub id                    (default Qwen/Qwen2.5-Math-1.5B)
#   DATA    directory with train.parquet/test.parquet (default data/gsm8k_verl, see prepare_gsm8k.py)
#   GPUS    accelerators on this node                (default 8)
#   DEVICE  cuda or npu (verl's trainer.device)      (default cuda)
#   REWARD  rlhf_ext reward spec                      (default math = accuracy 1.0, answer format 0.2)
#   RLHF_EXT_PRINT_ARGS=1  print the overrides (one per line) instead of training (used by the tests)
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-Math-1.5B}
DATA=${DATA:-data/gsm8k_verl}
GPUS=${GPUS:-8}
DEVICE=${DEVICE:-cuda}
REWARD=${REWARD:-math}
RUN_NAME=${RUN_NAME:-$(basename "${BASH_SOURCE[1]:-$0}" .sh)}
PYTHON=${PYTHON:-python3}

run_recipe() {
  local reward_file
  reward_file=$("$PYTHON" -m rlhf_ext.rewards.path --verl)
  local args=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/test.parquet"
    data.train_batch_size=256
    data.max_prompt_length=512
    data.max_response_length=1024
    data.filter_overlong_prompts=True
    data.truncation=error
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=64
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
    # rewards: rlhf_ext's MathGrader (hard time limit, no code execution) under verl's compute_score
    reward.custom_reward_function.path="$reward_file"
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.reward="$REWARD"
    +reward.custom_reward_function.reward_kwargs.timeout=5
    trainer.device="$DEVICE"
    trainer.n_gpus_per_node="$GPUS"
    trainer.nnodes=1
    trainer.critic_warmup=0
    trainer.logger='["console","tensorboard"]'
    trainer.project_name=rlhf_ext_verl
    trainer.experiment_name="$RUN_NAME"
    trainer.save_freq=-1
    trainer.test_freq=10
    trainer.total_epochs=3
    "$@"
  )
  if [ "${RLHF_EXT_PRINT_ARGS:-0}" = 1 ]; then
    printf '%s\n' "${args[@]}"
    return 0
  fi
  "$PYTHON" -m verl.trainer.main_ppo "${args[@]}"
}
