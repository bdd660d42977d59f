"""What the CPU target's process layout saves per training run: the tiny GRPO run, old layout vs new.

A CPU smoke run spends its time starting interpreters (torch, vLLM, DeepSpeed imports), not in its
steps. The CPU target runs vLLM's model runner inside the engine-core process and starts Ray without
its dashboard (rlhf_ext/patches/retarget/cpu_processes.py). This runs the same 2-step GRPO run of the
smoke tour both ways, alternating, and prints wall time and CPU seconds of the whole process tree
(the run's own and every process it waited for: Ray's, vLLM's, the actors') with their ratios:

    .venv/bin/python benchmarks/cpu_process_layout.py --task runs/tiny --repeats 2

``--task`` is the output of ``rlhf-ext tiny-task`` (built into a temporary folder when omitted).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

LAYOUTS = {
    "vLLM worker process + Ray dashboard (before)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "RLHF_EXT_RAY_DASHBOARD": "1"},
    "CPU target default": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "RLHF_EXT_RAY_DASHBOARD": "0"},
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", type=Path, help="a tiny task (rlhf-ext tiny-task --output DIR); built when omitted")
    p.add_argument("--repeats", type=int, default=2, help="runs per layout, alternating (default 2)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    from rlhf_ext.tours.smoke import run_training, train_command
    from rlhf_ext.tours.tiny_task import build_tiny_task

    work = Path(tempfile.mkdtemp(prefix="rlhf_ext_layout_"))
    task = args.task
    if task is None:
        task = work / "task"
        print(f"building the tiny task in {task} ...", flush=True)
        build_tiny_task(task, sft_steps=60, verbose=False)
    results = {name: [] for name in LAYOUTS}
    for i in range(args.repeats):
        for name, env in LAYOUTS.items():
            out = work / f"run{i}_{len(results[name])}_{'new' if 'default' in name else 'old'}"
            cmd = train_command(model=task / "model", prompts=task / "train.jsonl", output=out, estimator="grpo",
                                steps=2, prompts_per_step=4, n_samples=4, lr=5e-4)  # fmt: skip
            cpu0, t0 = _children_cpu(), time.monotonic()
            rc = run_training(cmd, Path(str(out) + ".log"), timeout=1800, echo=False, env=env)
            wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
            if rc != 0:
                print(f"{name}: the run failed (exit {rc}); see {out}.log")
                return 1
            results[name].append((wall, cpu))
            print(f"  [{i + 1}/{args.repeats}] {name}: {wall:6.1f} s wall, {cpu:6.1f} CPU-s", flush=True)
    (base_name, base), (new_name, new) = results.items()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    print(f"\n2-step GRPO run on the tiny task, median of {args.repeats}:")
    print(f"  {'layout':48s} {'wall s':>8s} {'CPU-s':>8s}")
    for name, (wall, cpu) in med.items():
        print(f"  {name:48s} {wall:8.1f} {cpu:8.1f}")
    print(f"  ratio new/old: wall x{med[new_name][0] / med[base_name][0]:.2f}, CPU x{med[new_name][1] / med[base_name][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
