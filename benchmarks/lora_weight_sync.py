"""LoRA weight sync to vLLM: merged weights (what rlhf_ext sends) vs vLLM's own LoRA support, side by side.

On the smoke shapes (the tiny task's 2-layer Qwen2, bf16 as the smoke run trains and rolls out,
LoRA rank 4 / alpha 8 on all linear layers, a rollout batch of 4 prompts x 4 samples x 16 new
tokens) it measures, each path in its own process (so resident memory is that path's alone):

* merged (rlhf_ext, :mod:`rlhf_ext.patches.openrlhf.lora_sync`): per sync, the merge on the trainer
  (every ``W + scale*B*A``), the bytes sent, the largest extra tensor memory the merge holds at once,
  and vLLM loading every tensor through its ``load_weights`` one at a time (as OpenRLHF's
  ``WorkerWrap.update_weight`` does after each broadcast); then a rollout batch's generation time;
* vLLM LoRA (``enable_lora``, a ``LoRARequest`` per rollout request): per sync, saving the adapter
  and vLLM loading it (first request with a new adapter id, less a request with a loaded one);
  a rollout batch's generation time with the adapter applied; the engine's extra resident memory.

    .venv/bin/python benchmarks/lora_weight_sync.py [--model DIR] [--rank 4] [--alpha 8] [--syncs 5] [--rounds 2]

Without ``--model`` a random model of the tiny task's shape is built in a temporary directory.
One thread for torch in both paths. Starts ``2 x --rounds`` vLLM engines one after the other (run
it under the e2e lock on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, SAMPLES, NEW_TOKENS = 4, 4, 16


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peft_model(model_dir: str, rank: int, alpha: int):
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha, target_modules="all-linear",
                        lora_dropout=0.0, bias="none")  # fmt: skip
    model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    return model


def _engine(model_dir: str, **extra):
    from vllm import LLM

    from rlhf_ext.npu.cpu_kv_cache import cpu_kv_cache_bytes

    kv_bytes = cpu_kv_cache_bytes(model_dir, 64, dtype="bfloat16")
    kwargs = dict(model=model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=64, seed=0,
                  enable_prefix_caching=False, kv_cache_memory_bytes=kv_bytes)
    kwargs.update(extra)
    return LLM(**kwargs)


def _prompts(model_dir: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [f"What is {a} + {b}?" for a, b in ((12, 30), (7, 5), (40, 41), (3, 99))][:PROMPTS]
    return [{"prompt_token_ids": tok(t)["input_ids"]} for t in texts for _ in range(SAMPLES)]


def _time_generate(llm, prompts, repeats: int, **kw) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    llm.generate(prompts, params, use_tqdm=False, **kw)  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, **kw)
        best = min(best, time.perf_counter() - start)
    return best


def _load_weights(worker, weights):
    worker.model_runner.model.load_weights(weights=weights)


def phase_merged(args) -> dict:
    import vllm.model_executor.layers.utils as layer_utils

    from rlhf_ext.patches.openrlhf.lora_sync import sync_entries
    from rlhf_ext.patches.retarget.vllm_cpu_weights import patch_cpu_gemm_dispatch

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model = _peft_model(args.model, args.rank, args.alpha)
    entries = sync_entries(model, only_changing=True)  # what the sync sends (lora_sync.broadcast_lora_to_vllm)
    merge_s, sent_bytes, peak_extra = [], 0, 0
    for _ in range(args.syncs):
        start = time.perf_counter()
        tensors = []
        for e in entries:
            t = e.materialize()
            tensors.append(t)
        merge_s.append(time.perf_counter() - start)
    for e, t in zip(entries, tensors):
        sent_bytes += t.numel() * t.element_size()
        if e.fresh:  # the copy of W, PEFT's delta, and its fp32 B@A on CPU for bf16 (get_delta_weight)
            peak_extra = max(peak_extra, t.numel() * t.element_size() * 2 + t.numel() * 4)
    patch_cpu_gemm_dispatch(layer_utils, "cpu")
    rss0 = _rss()
    llm = _engine(args.model)
    rss_engine = _rss() - rss0
    load_s = []
    for _ in range(args.syncs):
        start = time.perf_counter()
        for e, t in zip(entries, tensors):
            llm.collective_rpc(_load_weights, args=([(e.name, t)],))
        load_s.append(time.perf_counter() - start)
    gen_s = _time_generate(llm, _prompts(args.model), args.repeats)
    return {"merge_ms": 1000 * min(merge_s), "tensors": len(entries), "bytes_sent": sent_bytes,
            "peak_extra_bytes": peak_extra, "vllm_load_ms": 1000 * min(load_s), "generate_ms": 1000 * gen_s,
            "engine_rss_bytes": rss_engine}  # fmt: skip


def phase_vllm_lora(args) -> dict:
    from vllm.lora.request import LoRARequest

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model = _peft_model(args.model, args.rank, args.alpha)
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
    rss0 = _rss()
    llm = _engine(args.model, enable_lora=True, max_lora_rank=max(8, args.rank), max_loras=1)
    rss_engine = _rss() - rss0
    prompts = _prompts(args.model)
    from vllm import SamplingParams

    one = SamplingParams(max_tokens=1, temperature=1.0, seed=0)
    work = Path(tempfile.mkdtemp(prefix="lora_sync_bench_"))
    sync_s = []
    for i in range(1, args.syncs + 1):
        start = time.perf_counter()
        model.save_pretrained(work / f"v{i}")  # the adapter of this policy version
        request = LoRARequest(f"policy_v{i}", i, str(work / f"v{i}"))
        llm.generate(prompts[:1], one, use_tqdm=False, lora_request=request)  # loads it
        first = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate(prompts[:1], one, use_tqdm=False, lora_request=request)
        sync_s.append(first - (time.perf_counter() - start))
    gen_lora = _time_generate(llm, prompts, args.repeats, lora_request=request)
    gen_base = _time_generate(llm, prompts, args.repeats)
    return {"sync_ms": 1000 * min(sync_s), "adapter_bytes": adapter_bytes, "generate_ms": 1000 * gen_lora,
            "generate_no_adapter_ms": 1000 * gen_base, "engine_rss_bytes": rss_engine}  # fmt: skip


def _run_phase(phase: str, args) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--model", args.model, "--rank", str(args.rank),
           "--alpha", str(args.alpha), "--syncs", str(args.syncs), "--repeats", str(args.repeats)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1]}
    return json.loads(lines[-1][len("RESULT "):])


def _best(results):
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    return {key: min(r[key] for r in ok) for key in ok[0]}


def _mib(n) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: a random model of the tiny task's shape)")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=int, default=8)
    p.add_argument("--syncs", type=int, default=5, help="syncs timed per path; the best is reported")
    p.add_argument("--repeats", type=int, default=3, help="rollout batches timed per path; the best is reported")
    p.add_argument("--rounds", type=int, default=2, help="alternating runs of each path; each number's best is kept")
    p.add_argument("--phase", choices=("merged", "vllm_lora"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        import torch

        torch.set_num_threads(1)  # both paths alike, and a loaded 2-core machine does not oversubscribe
        result = (phase_merged if args.phase == "merged" else phase_vllm_lora)(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if not args.model:
        from rlhf_ext.tours.tiny_task import build_model, build_tokenizer

        args.model = tempfile.mkdtemp(prefix="lora_sync_model_")
        tok = build_tokenizer()
        tok.save_pretrained(args.model)
        build_model(tok, seed=0).save_pretrained(args.model)
    # alternate the two paths and keep each number's best: a busy shared machine slows one process at a time
    runs = {"merged": [], "vllm_lora": []}
    for _ in range(args.rounds):
        for phase in runs:
            runs[phase].append(_run_phase(phase, args))
    merged, lora = (_best(runs[phase]) for phase in ("merged", "vllm_lora"))
    print(f"LoRA rank {args.rank}, alpha {args.alpha}, all-linear; model {args.model}; bf16; "
          f"rollout batch {PROMPTS}x{SAMPLES} samples x {NEW_TOKENS} tokens; "
          f"best of {args.syncs} syncs x {args.rounds} rounds")
    print(f"{'':34}{'merged (rlhf_ext)':>22}{'vLLM LoRA':>22}")
    if "error" in merged or "error" in lora:
        print("merged:", merged, "\nvLLM LoRA:", lora)
        return 1
    rows = [
        ("per sync, trainer side", f"{merged['merge_ms']:.1f} ms merge", "(save: next row)"),
        ("per sync, vLLM side", f"{merged['vllm_load_ms']:.1f} ms load", f"{lora['sync_ms']:.1f} ms save+load"),
        ("bytes sent per sync", _mib(merged["bytes_sent"]), _mib(lora["adapter_bytes"])),
        ("extra trainer memory (peak, sizes)", _mib(merged["peak_extra_bytes"]), "0"),
        ("vLLM engine resident memory", _mib(merged["engine_rss_bytes"]), _mib(lora["engine_rss_bytes"])),
        ("rollout batch generation", f"{merged['generate_ms']:.0f} ms", f"{lora['generate_ms']:.0f} ms"),
        ("  same engine, no adapter", "", f"{lora['generate_no_adapter_ms']:.0f} ms"),
    ]
    for label, a, b in rows:
        print(f"{label:34}{a:>22}{b:>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
