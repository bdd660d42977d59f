"""evalkit's overhead over bare vLLM: wall time of an evalkit run / wall time of ``vllm.LLM.generate``.

Both sides get the same token-id prompts (MATH-500 problems rendered with evalkit's ``r1``
template) and the same sampling: ``SamplingParams(n=N, seed=problem_seed, temperature, top_p,
max_tokens)`` for the bare side, one seeded request per sample for evalkit (which is how vLLM
expands ``n`` internally), so they decode the same tokens -- the script checks that the texts
are identical. evalkit's side additionally grades every sample with the rlhf_ext grader (process
pool, concurrently with decoding), writes ``samples.jsonl``/``config.json`` and computes the
summary with its bootstrap intervals. Goal: ratio <= 1.10.

Two measurements, one run:

* ``generation phase`` (the goal): one engine loaded once in this process; alternately a bare
  ``LLM.generate`` and an evalkit ``execute`` into a fresh run directory, ``--repeats`` times
  after one warm-up of each; median wall times and their ratio.
* ``whole command`` (with ``--cli-repeats`` > 0): ``evalkit math500 ...`` as a subprocess against a
  subprocess that loads ``vllm.LLM`` with the same engine arguments and calls ``generate``;
  includes interpreter start, engine load and, for evalkit, data and tokenizer loading.

Usage: python benchmarks/evalkit_overhead.py [--problems 32] [--n-samples 4] [--max-tokens 512]
       [--repeats 5] [--cli-repeats 1] [--data ../shared/data/math500.jsonl]

The random tiny model stops with probability ~1/320 per token, so with --max-tokens 512 a sample
averages ~250 tokens; shorter caps make evalkit's fixed per-sample costs (vLLM's per-request input
processing, grading) a larger share than they are at real reasoning lengths (thousands of tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
from rlhf_ext.evalkit.generation import EngineSettings, engine_kwargs
spec = json.load(open(sys.argv[1]))
llm = LLM(**engine_kwargs(EngineSettings(model=spec["model"])))
prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
params = [SamplingParams(n=spec["n"], temperature=spec["temperature"], top_p=spec["top_p"],
                         max_tokens=spec["max_tokens"], seed=s) for s in spec["seeds"]]
outs = llm.generate(prompts, params, use_tqdm=False)
print(json.dumps({"tokens": sum(len(c.token_ids) for o in outs for c in o.outputs),
                  "wall_s": time.perf_counter() - t0}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data/math500.jsonl")
    parser.add_argument("--model", help="model directory (default: build the tiny random Qwen2)")
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cli-repeats", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    work = Path(tempfile.mkdtemp(prefix="evalkit_overhead_"))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(args, work: Path) -> int:
    from vllm import SamplingParams

    from rlhf_ext.evalkit.generation import EngineSettings, make_llm, platform_name
    from rlhf_ext.evalkit.runner import RunOptions, execute, prepare, problem_seed, render_prompts
    from rlhf_ext.evalkit.tiny_model import build_tiny_model
    from rlhf_ext.rewards import MathGrader

    model = args.model or str(build_tiny_model(work / "tiny"))
    options = dict(suite="math500", model=model, data=[args.data], limit=args.problems, n_samples=args.n_samples,
                   max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, progress=False)
    template_run = prepare(RunOptions(output=work / "probe", **options))
    render_prompts(template_run)
    problems = template_run.tasks[0].problems
    prompts = [{"prompt_token_ids": list(template_run.prompts[("math500", p.id)][1])} for p in problems]
    seeds = [problem_seed(0, "math500", p.id) for p in problems]

    def bare_params():
        return [SamplingParams(n=args.n_samples, temperature=args.temperature, top_p=args.top_p,
                               max_tokens=args.max_tokens, seed=s) for s in seeds]

    print(f"platform {platform_name()}, model {model}")
    print(f"workload: {len(problems)} MATH-500 problems x {args.n_samples} samples, max_tokens {args.max_tokens}, "
          f"temperature {args.temperature}, top_p {args.top_p}")
    t = time.perf_counter()
    llm = make_llm(EngineSettings(model=model))
    print(f"engine loaded in {time.perf_counter() - t:.1f} s")

    def run_bare():
        t0 = time.perf_counter()
        outs = llm.generate(prompts, bare_params(), use_tqdm=False)
        return time.perf_counter() - t0, outs

    def run_evalkit(i):
        run = prepare(RunOptions(output=work / f"evalkit_{i}", **options))
        run.prompts.update(template_run.prompts)  # rendered once, like the bare side's prompts
        # A fresh grader pool per run, started before the clock as the CLI starts it while the
        # engine loads; parsing the golds and grading every sample happen inside the timing.
        with MathGrader(timeout=5.0) as grader:
            grader.start(wait_ready=True)
            t0 = time.perf_counter()
            execute(run, log=lambda m: None, llm=llm, grader=grader)
            return time.perf_counter() - t0, run.output

    bare_times, evalkit_times = [], []
    _, warm_outs = run_bare()
    _, warm_dir = run_evalkit("warmup")
    for i in range(args.repeats):
        b, outs = run_bare()
        e, out_dir = run_evalkit(i)
        bare_times.append(b)
        evalkit_times.append(e)
        print(f"  repeat {i + 1}: bare generate {b:.2f} s, evalkit {e:.2f} s, ratio {e / b:.3f}")

    recs = {(r["problem_id"], r["sample_index"]): r for r in map(json.loads, (out_dir / "samples.jsonl").open())}
    identical = all(recs[(p.id, j)]["response"] == c.text
                    for p, o in zip(problems, outs) for j, c in enumerate(o.outputs))
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    bare_med, evalkit_med = statistics.median(bare_times), statistics.median(evalkit_times)
    print(f"tokens generated per run: {tokens}; evalkit samples identical to bare LLM.generate: {identical}")
    print(f"generation phase, median of {args.repeats}: bare {bare_med:.2f} s ({tokens / bare_med:,.0f} tok/s), "
          f"evalkit {evalkit_med:.2f} s -> ratio evalkit/bare = {evalkit_med / bare_med:.3f} (goal <= 1.10)")

    if args.cli_repeats > 0:
        del llm  # free the engine before the subprocess runs
        spec = work / "bare_spec.json"
        spec.write_text(json.dumps({"model": model,
                                    "prompts": [p["prompt_token_ids"] for p in prompts], "seeds": seeds,
                                    "n": args.n_samples, "temperature": args.temperature, "top_p": args.top_p,
                                    "max_tokens": args.max_tokens}))
        cli_bare, cli_evalkit = [], []
        for i in range(args.cli_repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", BARE_SCRIPT, str(spec)], check=True, capture_output=True)
            cli_bare.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rlhf_ext.evalkit", "math500", "--model", model, "--data", args.data,
                            "--limit", str(args.problems), "--n-samples", str(args.n_samples), "--max-tokens",
                            str(args.max_tokens), "--temperature", str(args.temperature), "--top-p", str(args.top_p),
                            "--output", str(work / f"cli_{i}"), "--no-progress"], check=True, capture_output=True)
            cli_evalkit.append(time.perf_counter() - t0)
            print(f"  command {i + 1}: bare script {cli_bare[-1]:.1f} s, evalkit CLI {cli_evalkit[-1]:.1f} s")
        b, e = statistics.median(cli_bare), statistics.median(cli_evalkit)
        print(f"whole command (process start, engine load, generation), median of {args.cli_repeats}: "
              f"bare {b:.1f} s, evalkit {e:.1f} s -> ratio {e / b:.3f}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
