"""``python -m rlhf_ext.tours.distill --workdir DIR``: the smoke tour with a teacher (on-policy distillation).

On a CPU, with no model hub:

1. the tiny task and its tiny Qwen2 (the student: the smoke tour's model, SFT-warmed 120 steps) and
   the same model trained longer (the teacher: ``--teacher-sft-steps``, default 400), same tokenizer;
2. both evaluated with ``evalkit`` (avg@n with bootstrap intervals);
3. the unmodified ``python -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext`` with ``--rlhf_ext.teacher``:
   the teacher scores every token the student samples, the student learns from it
   (``--rlhf_ext.distill.*``, default: the k3 reverse KL backpropagated, distillation alone);
4. the student evaluated again; the reverse KL to the teacher per step (``train/distill/reverse_kl_k3``
   in the run record) and the three accuracies are printed.

Numbers and the command that produced them: docs/smoke.md ("With a teacher").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from rlhf_ext.tours.smoke import evaluate, run_record_dir, run_training, train_command, weights_changed


def distill_flags(teacher: Path, *, loss_mode: str, use_policy_gradient: bool, use_task_rewards: bool,
                  coef: float = 1.0) -> List[str]:
    """The plugin's distillation flags of the tour's run."""
    return ["--rlhf_ext.teacher", str(teacher), "--rlhf_ext.distill.loss_mode", loss_mode,
            "--rlhf_ext.distill.use_policy_gradient", str(use_policy_gradient).lower(),
            "--rlhf_ext.distill.use_task_rewards", str(use_task_rewards).lower(),
            "--rlhf_ext.distill.distillation_loss_coef", str(coef)]  # fmt: skip


def _series(record: Path, key: str) -> List[float]:
    path = record / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            value = json.loads(line).get(key)
            if isinstance(value, (int, float)):
                out.append(float(value))
    return out


def accuracy_line(summary: dict) -> str:
    """``avg@n`` of a one-task evalkit summary in %, with its bootstrap 95% interval."""
    (result,) = summary["tasks"].values()
    metric = result["avg@n"]
    low, high = metric["ci95"]
    return f"avg@{summary['n_samples']} {100 * metric['value']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.tours.distill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("rlhf_ext_distill"), help="where everything is written")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per rollout batch (default 8)")
    parser.add_argument("--n-samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--lr", type=float, default=5e-4, help="student learning rate (default 5e-4)")
    parser.add_argument("--teacher-sft-steps", type=int, default=400,
                        help="supervised steps of the teacher (the student has the tiny task's 120; default 400)")
    parser.add_argument("--loss-mode", default="k3", help="--rlhf_ext.distill.loss_mode (default k3)")
    parser.add_argument("--use-policy-gradient", action="store_true",
                        help="the distillation loss as a per-token reward (default: backpropagated)")
    parser.add_argument("--with-task-rewards", action="store_true",
                        help="add the math reward's GRPO loss (default: distillation alone)")
    parser.add_argument("--eval-samples", type=int, default=8, help="evalkit samples per problem (default 8)")
    parser.add_argument("--no-eval", action="store_true", help="train only")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before the training is stopped")
    args = parser.parse_args(argv)

    from rlhf_ext.tours.tiny_task import build_tiny_task

    work = args.workdir.resolve()
    task, teacher_task, checkpoint = work / "task", work / "teacher_task", work / "trained"
    for where, steps, role in ((task, 120, "student"), (teacher_task, args.teacher_sft_steps, "teacher")):
        if not (where / "task.json").exists():
            print(f"[1/4] building the tiny task's {role} ({steps} SFT steps)", flush=True)
            build_tiny_task(where, sft_steps=steps)
    student, teacher = task / "model", teacher_task / "model"
    cmd = train_command(model=student, prompts=task / "train.jsonl", output=checkpoint, steps=args.steps,
                        prompts_per_step=args.prompts_per_step, n_samples=args.n_samples, lr=args.lr, seed=args.seed)
    cmd += distill_flags(teacher, loss_mode=args.loss_mode, use_policy_gradient=args.use_policy_gradient,
                         use_task_rewards=args.with_task_rewards)  # fmt: skip
    evals = {}
    if not args.no_eval:
        print("[2/4] evaluating the teacher and the student", flush=True)
        for name, model in (("teacher", teacher), ("before", student)):
            evals[name] = evaluate(model, task / "eval.jsonl", work / f"eval_{name}", n_samples=args.eval_samples,
                                   max_tokens=16, seed=0)  # fmt: skip
    print(f"[3/4] distilling ({args.steps} steps) with RLHF_EXT_DEVICE=cpu:\n  " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    try:
        rc = run_training(cmd, work / "train.log", timeout=args.timeout)
    except subprocess.TimeoutExpired:
        rc = None
    record = run_record_dir(checkpoint)
    print(f"  run record: {record} (rlhf-ext runs show {record}; rlhf-ext report {record})", flush=True)
    if rc != 0:
        print(f"training failed ({'exit ' + str(rc) if rc is not None else 'timeout'}); console: {work / 'train.log'}",
              file=sys.stderr)
        return rc or 1
    k3, k1 = _series(record, "train/distill/reverse_kl_k3"), _series(record, "train/distill/reverse_kl_k1")
    k = max(1, min(3, len(k3) // 2))
    print(f"  trained in {time.time() - t0:.0f} s; {len(k3)} steps")
    if k3:
        print(f"  reverse KL to the teacher (k3, per token): first {k} steps {_mean(k3[:k]):.4f}, "
              f"last {k} steps {_mean(k3[-k:]):.4f}; per step: " + ", ".join(f"{v:.3f}" for v in k3))
    if k1:
        print(f"  reverse KL to the teacher (k1, per token): first {k} steps {_mean(k1[:k]):.4f}, "
              f"last {k} steps {_mean(k1[-k:]):.4f}")
    changed = weights_changed(student, checkpoint)
    print(f"  weights changed: {sum(v > 0 for v in changed.values())}/{len(changed)} tensors")
    if not args.no_eval:
        print("[4/4] evaluating the distilled student", flush=True)
        evals["after"] = evaluate(checkpoint, task / "eval.jsonl", work / "eval_after", n_samples=args.eval_samples,
                                  max_tokens=16, seed=0)  # fmt: skip
        for name in ("teacher", "before", "after"):
            print(f"{name + ':':9s}{accuracy_line(evals[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
