"""What the CPU training dtype costs on this CPU: forward+backward of the tiny task's 2-layer Qwen2.

On CPUs without native bf16 (AVX2-only: no AVX-512-BF16, no AMX) bf16 and fp16 arithmetic is
emulated and the CPU smoke runs, which OpenRLHF 0.11.2 can only train in bf16 or fp16, get slow.
Run it as the CPU is, and as an AVX2-only CPU through scripts/avx2_only/run.sh:

    .venv/bin/python benchmarks/cpu_train_dtype.py
    bash scripts/avx2_only/run.sh .venv/bin/python benchmarks/cpu_train_dtype.py

Prints the best of ``--repeats`` timings per dtype and the ratio to float32 (interleaved, one
thread, so a noisy machine shifts all dtypes alike).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="timings per dtype; the best is reported (default 3)")
    p.add_argument("--passes", type=int, default=10, help="forward+backward passes per timing (default 10)")
    args = p.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    # the shape of rlhf_ext.tours.tiny_task's model, on a batch like the smoke run's micro-batch
    cfg = Qwen2Config(vocab_size=311, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=64)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    best = {dt: float("inf") for dt in dtypes}
    for _ in range(args.repeats):
        for dt in dtypes:
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(cfg).to(dt)
            x = torch.randint(0, cfg.vocab_size, (16, 48))
            start = time.perf_counter()
            for _ in range(args.passes):
                model(input_ids=x, labels=x).loss.backward()
            best[dt] = min(best[dt], time.perf_counter() - start)
    print(f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}; "
          f"{args.passes} forward+backward passes, best of {args.repeats}")
    for dt in dtypes:
        print(f"  {str(dt).removeprefix('torch.'):9s} {best[dt]:7.3f} s   x{best[dt] / best[torch.float32]:5.2f} vs float32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
