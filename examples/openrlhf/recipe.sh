#!/usr/bin/env bash
# The one recipe every example shares: Qwen2.5-Math-1.5B, GSM8K prompts, rlhf_ext's math reward,
# OpenRLHF 0.11.x with --plugin rlhf_ext on one 8-GPU node. Each algorithm script sources this file
# and calls `run_recipe` with its algorithm switch only, so runs differ in nothing else.
#
# Settings (environment):
#   MODEL   model path or hub id                 (default Qwen/Qwen2.5-Math-1.5B)
#   DATA    prompt JSONL with question/answer     (default data/gsm8k_train.jsonl, see prepare_gsm8k.py)
#   GPUS    GPUs on this node                     (default 8)
#   OUT     output directory                      (default runs/openrlhf/<script name>)
#   PLACEMENT  colocated (default: actor, reference and vLLM share every GPU, sleep mode between phases)
#              or split (half the GPUs train, half generate; no sleep: what --train.async_enable needs)
#   RLHF_EXT_PRINT_ARGS=1  print the arguments (NUL-separated) instead of training (used by the tests)
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-Math-1.5B}
DATA=${DATA:-data/gsm8k_train.jsonl}
GPUS=${GPUS:-8}
RUN_NAME=${RUN_NAME:-$(basename "${BASH_SOURCE[1]:-$0}" .sh)}
OUT=${OUT:-runs/openrlhf/$RUN_NAME}
PLACEMENT=${PLACEMENT:-colocated}

run_recipe() {
  local placement
  case "$PLACEMENT" in
    # actor, reference and vLLM share the GPUs (sleep mode between phases)
    colocated) placement=(
      --actor.num_nodes 1 --actor.num_gpus_per_node "$GPUS"
      --ref.num_nodes 1 --ref.num_gpus_per_node "$GPUS"
      --vllm.num_engines "$GPUS" --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.6
      --train.colocate_all --vllm.enable_sleep --ds.enable_sleep) ;;
    # half the GPUs train (actor and reference colocated), half generate, at the same time
    split) placement=(
      --actor.num_nodes 1 --actor.num_gpus_per_node $((GPUS / 2))
      --ref.num_nodes 1 --ref.num_gpus_per_node $((GPUS / 2))
      --vllm.num_engines $((GPUS / 2)) --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.9
      --train.colocate_actor_ref) ;;
    *) echo "recipe.sh: PLACEMENT must be colocated or split, got '$PLACEMENT'" >&2; return 2 ;;
  esac
  local args=(
    --plugin rlhf_ext
    --actor.model_name_or_path "$MODEL"
    "${placement[@]}"
    --ds.zero_stage 3 --ds.param_dtype bf16 --ds.packing_samples --actor.gradient_checkpointing_enable
    # data: GSM8K questions, gold answers ("... #### 72") graded by rlhf_ext's math reward
    --data.prompt_dataset "$DATA" --data.input_key question --data.label_key answer --data.apply_chat_template
    --data.max_len 3072 --rollout.max_new_tokens 2048
    --reward.remote_url rlhf_ext:math --reward.grader_timeout 5
    # rollout: 128 prompts x 8 samples per step, then 4 optimizer steps of 256 samples
    --rollout.batch_size 128 --rollout.n_samples_per_prompt 8 --rollout.micro_batch_size 16
    --rollout.temperature 1.0
    --train.batch_size 256 --train.micro_batch_size 4 --train.max_epochs 1 --train.num_episodes 1
    --actor.adam.lr 1e-6 --actor.eps_clip_low_high 0.2 0.28
    # no KL term (Dr.GRPO, DAPO); to add one: --algo.kl.use_loss --algo.kl.init_coef 1e-3 --algo.kl.estimator k3
    --algo.kl.init_coef 0
    --ckpt.output_dir "$OUT/model" --ckpt.path "$OUT/ckpt" --ckpt.save_steps 50
    --logger.tensorboard_dir "$OUT/tensorboard"
    # the algorithm switch of the calling script
    "$@"
  )
  if [[ -n "${RLHF_EXT_PRINT_ARGS:-}" ]]; then
    printf '%s\0' "${args[@]}"
    return
  fi
  mkdir -p "$OUT"
  python -m openrlhf.cli.train_ppo_ray "${args[@]}" 2>&1 | tee "$OUT/train.log"
}
