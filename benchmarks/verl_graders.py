"""verl's own math graders vs rlhf_ext's verl reward entry, called from threads as verl calls them.

verl 0.9's reward loop calls ``compute_score`` once per sample from the threads of an executor
(``NaiveRewardManager.run_single`` -> ``loop.run_in_executor``). This script scores the same corpus
that way (a thread pool) with:

* ``math_verify.parse/verify`` called directly (its timeouts are SIGALRM-based, as in Open-R1's
  accuracy reward): the baseline that cannot run off the main thread;
* verl ``utils.reward_score.math_verify.compute_score`` (math-verify in a pool of 4 spawned
  processes; a sample that overruns gets ``timeout_score`` but its worker keeps computing);
* verl ``utils.reward_score.math_reward.compute_score`` (verl's default for MATH data sources:
  string normalisation, no time limit needed, no equivalence of forms);
* rlhf_ext ``rewards.verl_reward.compute_score`` (MathGrader: worker processes killed and replaced
  at the time limit).

Phase 1: ordinary samples only (throughput, verdicts against the known labels). Phase 2: a few
hostile answers (``\\boxed{9^{9^{9^{9}}}}``, math-verify issue #65) submitted first, then
ordinary samples: how many ordinary samples are still graded right, and how long it takes.
Run it in the verl environment (.venv-verl):

    .venv-verl/bin/python benchmarks/verl_graders.py          # 400 + 6 hostile + 32 samples, 8 threads, 2 s limit

Results and the command: docs/benchmarks.md. Every worker process the graders leave computing is
killed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HOSTILE = "Let me compute. The answer is \\boxed{9^{9^{9^{9}}}}"


def corpus(n: int):
    """``(response, gold, label)``: correct, equivalent-form, wrong and answerless responses."""
    items = []
    for i in range(n):
        gold = str(3 + (i * 37) % 997)
        kind = i % 4
        if kind == 0:
            items.append((f"Adding up, we get \\boxed{{{gold}}}.", gold, True))
        elif kind == 1:  # an equivalent form the grader has to recognise
            items.append((f"So the result is \\boxed{{\\frac{{{2 * int(gold)}}}{{2}}}}", gold, True))
        elif kind == 2:
            items.append((f"The answer is \\boxed{{{int(gold) + 1}}}", gold, False))
        else:
            items.append(("I am not sure how to solve this.", gold, False))
    return items


def direct_math_verify(timeout):
    from math_verify import parse, verify

    def score(response, gold):
        return float(verify(parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout), parse(response, parsing_timeout=timeout),
                            timeout_seconds=timeout))

    return score


def verl_math_verify(timeout):
    from verl.utils.reward_score import math_verify as mv

    return lambda response, gold: float(mv.compute_score(response, gold, timeout=timeout))


def verl_math_reward(timeout):
    from verl.utils.reward_score import math_reward

    return lambda response, gold: float(math_reward.compute_score(response, gold))


def rlhf_ext_verl(timeout):
    from rlhf_ext.rewards.verl_protocol import compute_score

    return lambda response, gold: compute_score(data_source="bench", solution_str=response, ground_truth=gold,
                                                extra_info={}, reward="accuracy", timeout=timeout)["score"]


GRADERS = {
    "math-verify direct (SIGALRM timeouts)": direct_math_verify,
    "verl math_verify.compute_score": verl_math_verify,
    "verl math_reward.compute_score": verl_math_reward,
    "rlhf_ext verl_reward.compute_score": rlhf_ext_verl,
}


def run(score, items, threads):
    errors = []

    def one(item):
        try:
            return score(item[0], item[1])
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")
            return None

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, items))
    return results, time.perf_counter() - start, errors


def summarize(results, items, wall, errors):
    graded = [(r, it[2]) for r, it in zip(results, items) if r is not None]
    right = sum(1 for r, label in graded if (r > 0.5) == label)
    correct_items = sum(1 for it in items if it[2])
    credited = sum(1 for r, label in graded if label and r > 0.5)
    return {"samples": len(items), "wall_s": round(wall, 2), "samples_per_s": round(len(items) / wall, 1),
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "verdicts_right": right, "verdicts_right_frac": round(right / len(items), 3),
            "correct_answers_credited": f"{credited}/{correct_items}"}


def _children():
    """PIDs of this process's descendants (Linux /proc)."""
    me, kids, frontier = os.getpid(), set(), {os.getpid()}
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    procs[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    while frontier:
        frontier = {pid for pid, parent in procs.items() if parent in frontier} - kids
        kids |= frontier
    kids.discard(me)
    return kids


def cleanup():
    try:
        from verl.utils.reward_score import math_verify as mv

        if mv._pool is not None:
            mv._pool.shutdown(wait=False, cancel_futures=True)
            mv._pool = None
    except Exception:
        pass
    from rlhf_ext.rewards import verl_protocol as verl_reward

    verl_reward.close_all()
    for pid in _children():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Run it")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=400, help="ordinary samples in phase 1 (default 400)")
    parser.add_argument("--after", type=int, default=32, help="ordinary samples after the hostile ones (default 32)")
    parser.add_argument("--hostile", type=int, default=6, help="hostile samples in phase 2 (default 6)")
    parser.add_argument("--threads", type=int, default=8, help="executor threads, as verl's reward loop (default 8)")
    parser.add_argument("--timeout", type=float, default=2.0, help="per-sample time limit, seconds (default 2)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    import verl  # noqa: F401

    out = {"config": vars(args), "phase1": {}, "phase2": {}}
    items = corpus(args.samples)
    tail = corpus(args.after)
    hostile = [(HOSTILE, "1", False)] * args.hostile
    try:
        for name, make in GRADERS.items():
            score = make(args.timeout)
            run(score, items[:8], 2)  # warm-up: worker pools, imports
            res, wall, errs = run(score, items, args.threads)
            out["phase1"][name] = summarize(res, items, wall, errs)
            print(f"[phase 1] {name}: {json.dumps(out['phase1'][name])}", flush=True)
        for name, make in GRADERS.items():
            if name.startswith("math-verify direct"):
                continue  # it errors on every sample in threads already
            if name.startswith("verl math_reward"):
                continue  # no time limit, no hang: string comparison only
            score = make(args.timeout)
            res, wall, errs = run(score, hostile + tail, args.threads)
            summary = summarize(res[len(hostile):], tail, wall, errs)
            summary["hostile_scored"] = res[:len(hostile)]
            out["phase2"][name] = summary
            print(f"[phase 2] {name}: {json.dumps(summary)}", flush=True)
            cleanup()
    finally:
        cleanup()
    base = out["phase1"]["verl math_verify.compute_score"]["samples_per_s"]
    ours = out["phase1"]["rlhf_ext verl_reward.compute_score"]["samples_per_s"]
    print(f"\nthroughput ratio, rlhf_ext / verl math_verify (phase 1): {ours / base:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
