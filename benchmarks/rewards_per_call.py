"""The reward function called once per sample from a thread pool, against sequential math-verify (issue 41).

Usage (from the repository root)::

    .venv/bin/python benchmarks/rewards_per_call.py [--repeats 3] [--json out.json]

This is the call pattern of OpenRLHF's custom reward function without the plugin's batching
(``asyncio.to_thread(reward_func, [query], [prompt], [label])`` per finished sample, on the event
loop's default executor of min(32, CPUs + 4) threads; a remote reward server's handler threads call it
the same way): a :class:`concurrent.futures.ThreadPoolExecutor` of that size, one ``reward_func`` call
per sample, all samples submitted at once, the wall time until the last returns. ``reward_func`` is
rlhf_ext's reward file (``python -m rlhf_ext.rewards.path``, default ``math`` spec), loaded by path
as OpenRLHF loads it. Baseline: sequential math-verify in the main thread as Open-R1 calls it
(:func:`rewards_throughput.baseline_grade`: parse gold, parse answer, verify, no cache of our own).

Corpora (responses are the MATH-500 reference solution, or GSM8K's worked solution, ending in the
sample's final answer):

* **MATH-500 answers and near misses** (1,000 samples): for each of the 250 even-numbered problems
  (the 250 others warm both sides up) the gold as
  written, an equal spelling of it where one is generated (``0.5`` / ``\\frac12``, ``\\dfrac{3}{4}`` /
  ``0.75``, ``-\\frac{1}{2}`` / ``\\frac{-1}{2}``, ``2\\sqrt{3}`` / ``\\sqrt{12}``, ``\\frac{\\pi}{2}`` /
  ``\\frac{1}{2}\\pi``, ``(1,2)`` / ``(1, 2)``; otherwise the gold again with ``\\left( \\right)`` or
  spacing changes), and two near misses: ``(gold)+1`` and the gold with its last digit changed;
  shuffled.
* **integer answers** (1,000 samples): :func:`rewards_throughput.integer_group_corpus` -- GSM8K and
  AIME problems in GRPO groups of 8, spellings a policy writes (``\\boxed{N}``, "The answer is N.",
  ``#### N``, ``<answer>`` tags, thousands commas, wrong and missing answers).

Each repetition starts both sides alike: a fresh grader pool with the fast path's memories cleared,
and the baseline in a fresh process, both warmed up through math-verify on the same samples
(:func:`warm_up_items`: the 250 odd-numbered MATH-500 problems' samples and answers in MATH-500's
forms that are no MATH-500 gold). A long-lived grader knows the LaTeX forms, not the next answers; a
baseline that repeats the corpus in one process would grow latex2sympy's parser caches on exactly
the measured answers (on the samples the fast path leaves to the workers its second pass took 8.9
ms a sample against 12.4 for its first), and workers warmed on nothing would pay for every form; a full garbage
collection before every window (the start-up heap frozen once, as vLLM's engine does).
Medians of ``--repeats`` interleaved repetitions; the verdicts of both sides are compared on every
sample the grader does not rewrite (``rewards_throughput.rewrites``).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import rewards_throughput as rt  # noqa: E402

from rlhf_ext.rewards import prepare_gold  # noqa: E402
from rlhf_ext.rewards.exact_numbers import clear_caches, exact_verdict  # noqa: E402


def _last_digit_changed(answer: str):
    """``\\frac{3}{4}`` -> ``\\frac{3}{5}``: the last digit moved by one (9 -> 8), or None without digits."""
    m = None
    for m in re.finditer(r"\d", answer):
        pass
    if m is None:
        return None
    d = int(m.group(0))
    return answer[:m.start()] + str(d - 1 if d == 9 else d + 1) + answer[m.end():]


def equal_spelling(answer: str):
    """Another spelling of ``answer`` with the same value, or None when none is generated here."""
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", answer)
    if m:
        num, den = int(m.group(2)), int(m.group(3))
        rest = den
        for p in (2, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1 and den != 0 and len(str(num)) < 7:
            text = repr(num / den)
            return ("-" if m.group(1) else "") + (text[:-2] if text.endswith(".0") else text)
        return "\\frac{%s%s}{%s}" % (m.group(1), num, den)  # -\frac{1}{2} -> \frac{-1}{2}
    m = re.fullmatch(r"(-?)(\d+)\.(\d+)", answer)
    if m and len(m.group(3)) <= 4:
        digits = m.group(2) + m.group(3)
        return "%s\\frac{%d}{%d}" % (m.group(1), int(digits), 10 ** len(m.group(3)))
    m = re.fullmatch(r"(\d*)\s*\\sqrt\{(\d+)\}", answer)
    if m:
        k = int(m.group(1) or 1)
        return "\\sqrt{%d}" % (k * k * int(m.group(2)))
    m = re.fullmatch(r"\\[dt]?frac\{(\d*)\\pi\}\{(\d+)\}", answer)
    if m:
        return "\\frac{%s}{%s}\\pi" % (m.group(1) or 1, m.group(2))
    if answer.startswith("(") and "," in answer:
        return answer.replace(",", ", ") if ", " not in answer else answer.replace(", ", ",")
    if re.fullmatch(r"-?\d+", answer):
        return "\\frac{%d}{1}" % int(answer) if len(answer) < 6 else answer + ".0"
    return None


def math500_near_miss_corpus(data_dir: str, parity: int = 0):
    """[(prompt, response, gold, kind)]: per MATH-500 problem of the given index parity (0: the 250
    measured, 1: the 250 that warm both sides up) the gold, an equal spelling, ``(gold)+1`` and the gold
    with its last digit changed (see the module docstring); shuffled, deterministic."""
    rows = rt._rows(data_dir, "math500.jsonl")[parity::2]
    out = []
    for row in rows:
        ans, body = row["answer"], rt._solution_body(row)
        prompt = rt.CHAT_PROMPT.format(problem=row["problem"])
        def boxed(answer):
            return body + " $\\boxed{" + answer + "}$."

        out.append((prompt, boxed(ans), ans, "correct"))
        same = equal_spelling(ans)
        out.append((prompt, boxed(same if same is not None else " " + ans + " "), ans, "equivalent"))
        out.append((prompt, boxed("(" + ans + ")+1"), ans, "near_miss"))
        changed = _last_digit_changed(ans)
        out.append((prompt, boxed(changed if changed is not None else ans + "+1"), ans, "near_miss"))
    random.Random(41).shuffle(out)
    return out


def fast_path_check(items):
    """(agreeing, decided): the fast path's verdict against the full grader's (the worker's code,
    ``grade_response``, in this thread) on every sample the fast path decides."""
    from rlhf_ext.rewards.math_verify_recipe import grade_response

    agree = decided = 0
    for _, t, g, _ in items:
        gold_text = prepare_gold(g)
        quick = exact_verdict(t, gold_text)
        if quick is not None:
            decided += 1
            agree += quick == grade_response(t, gold_text, {})
    return agree, decided


def load_reward_file():
    """rlhf_ext's OpenRLHF reward file, loaded by path as OpenRLHF loads it."""
    path = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path"], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.strip()
    spec = importlib.util.spec_from_file_location("rlhf_ext_reward_file_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fresh_pool(reward_file, warm):
    """A new grader pool behind the reward file (a new rollout actor), its workers warmed up through
    math-verify on ``warm`` (the fast path off meanwhile, so that they see what the baseline saw), the
    fast path's memories cleared."""
    from rlhf_ext.rewards.openrlhf_protocol import scorer_from_env

    scorer = scorer_from_env()
    scorer.reward.grader.close()
    grader = scorer.reward.grader.start()
    grader.fast_path = False
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda x: reward_file.reward_func([x[0] + x[1] + "<|im_end|>"], [x[0]], [x[2]]), warm))
    finally:
        grader.fast_path = True
    rt._all_workers_ready(grader)
    clear_caches()
    return grader


def per_call(reward_file, items, threads: int):
    """One ``reward_func`` call per sample from a pool of ``threads`` threads; (wall s, outputs)."""
    with ThreadPoolExecutor(threads) as pool:
        # the pool's threads start before the clock, as an event loop's default executor lives on
        list(pool.map(lambda _: None, range(threads)))
        gc.collect()
        s = time.perf_counter()
        futures = [pool.submit(reward_file.reward_func, [p + t + "<|im_end|>"], [p], [g]) for p, t, g, _ in items]
        outs = [f.result() for f in futures]
        wall = time.perf_counter() - s
    return wall, outs


def _corpora(data_dir: str, only=None) -> dict:
    out = {}
    if only in (None, "math500"):
        out["MATH-500 answers and near misses"] = math500_near_miss_corpus(data_dir, parity=0)
    if only in (None, "integer"):
        out["integer answers (GSM8K + AIME, groups of 8)"] = rt.integer_group_corpus(data_dir)
    return out


def warm_up_items(data_dir: str):
    """What both sides see before each measured window, through math-verify: answers in MATH-500's LaTeX
    forms that are no MATH-500 gold, and the other 250 MATH-500 problems' samples (a rollout actor's
    graders are long-lived: latex2sympy's parser caches know the forms, not the measured answers)."""
    return rt.warm_corpus(data_dir) + math500_near_miss_corpus(data_dir, parity=1)


def _baseline_child(data_dir: str, name: str) -> None:
    """Child mode: sequential math-verify on one corpus in a fresh process warmed up like the grader's
    workers (:func:`warm_up_items`); prints JSON (wall, CPU, verdicts)."""
    items = _corpora(data_dir)[name]
    for _, t, g, _ in warm_up_items(data_dir):
        rt.baseline_grade(t, g)
    clear_caches()
    gc.collect()
    gc.freeze()
    s, c = time.perf_counter(), time.process_time()
    verdicts = [rt.baseline_grade(t, g) for _, t, g, _ in items]
    print(json.dumps({"wall": time.perf_counter() - s, "cpu": time.process_time() - c, "verdicts": verdicts}))


def baseline_cold(data_dir: str, name: str) -> dict:
    """Sequential math-verify in a fresh process (as each repetition's grader workers are fresh): its
    parser caches (latex2sympy's ANTLR DFA, which grows with every new input) know the warm-up
    answers and not the corpus, as the workers' do."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--data", data_dir, "--_baseline", name],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args, corpora) -> dict:
    reward_file = load_reward_file()
    warm = warm_up_items(args.data)
    gc.collect()
    gc.freeze()
    threads = min(32, (os.cpu_count() or 1) + 4)
    report = {}
    for name, items in corpora.items():
        walls = {"baseline": [], "per_call": []}
        cpu = {"baseline": [], "per_call": []}
        decided = []
        for rep in range(args.repeats):
            measured = baseline_cold(args.data, name)
            base = measured["verdicts"]
            walls["baseline"].append(measured["wall"])
            cpu["baseline"].append(measured["cpu"])
            grader = fresh_pool(reward_file, warm)
            pids = [w.proc.pid for w in grader._pool._workers]
            before = grader.stats()["fast_path"]
            c, w0 = time.process_time(), sum(rt._cpu_seconds(p) for p in pids)
            wall, outs = per_call(reward_file, items, threads)
            walls["per_call"].append(wall)
            cpu["per_call"].append(time.process_time() - c + sum(rt._cpu_seconds(p) for p in pids) - w0)
            decided.append(grader.stats()["fast_path"] - before)
            rt._progress(name, rep + 1, args.repeats)
        comparable = [i for i, (_, t, g, _) in enumerate(items) if not rt.rewrites(t, g)]
        agree = sum(bool(outs[i]["scores"][0]) == base[i] for i in comparable)
        differ = [(items[i][1][-60:], items[i][2], base[i]) for i in comparable
                  if bool(outs[i]["scores"][0]) != base[i]]
        med = {k: statistics.median(v) for k, v in walls.items()}
        report[name] = {
            "samples": len(items), "fast_path_decided": decided[-1],
            "wall_s": {k: round(v, 3) for k, v in med.items()},
            "all_walls_s": {k: [round(x, 3) for x in v] for k, v in walls.items()},
            "ratio": round(med["baseline"] / med["per_call"], 2),
            "all_ratios": [round(b / p, 2) for b, p in zip(walls["baseline"], walls["per_call"])],
            "cpu_ms_per_sample": {k: round(1000 * statistics.median(v) / len(items), 3) for k, v in cpu.items()},
            "agreement_not_rewritten": f"{agree}/{len(comparable)}", "disagreements": differ[:10],
        }
    from rlhf_ext.rewards.openrlhf_protocol import scorer_from_env

    scorer_from_env().reward.grader.close()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"), help="benchmark data folder")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (medians are reported)")
    parser.add_argument("--only", choices=("math500", "integer"), default=None, help="one corpus only")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--without-arithmetic", action="store_true",
                        help="the fast path as before issue 41 (no exact_expressions parser), for comparison")
    parser.add_argument("--_baseline", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.without_arithmetic:
        import rlhf_ext.rewards.exact_numbers as exact_numbers

        exact_numbers.expression_value = lambda text: None  # this process only: the baseline is a child
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if args._baseline:
        _baseline_child(args.data, args._baseline)
        return 0
    corpora = _corpora(args.data, args.only)
    for name, items in corpora.items():
        n = sum(exact_verdict(t, prepare_gold(g)) is not None for _, t, g, _ in items)
        print(f"{name}: {len(items)} samples, the fast path decides {n}", flush=True)
    checks = {name: fast_path_check(items) for name, items in corpora.items()}
    for name, (agree, decided) in checks.items():
        print(f"{name}: fast-path verdicts equal to the full grader's (the worker's code, this thread): "
              f"{agree}/{decided}", flush=True)
    clear_caches()
    load = os.getloadavg()
    report = measure(args, corpora)
    for name, (agree, decided) in checks.items():
        report[name]["fast_path_vs_full_grader"] = f"{agree}/{decided}"
    load_after = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, {min(32, (os.cpu_count() or 1) + 4)} caller threads; load average "
          f"{load[0]:.2f} -> {load_after[0]:.2f}; medians of {args.repeats}")
    print(f"{'corpus':48s}{'math-verify':>12s}{'per call':>10s}{'ratio':>8s}  runs        agreement")
    goals = {"MATH-500 answers and near misses": 4.0, "integer answers (GSM8K + AIME, groups of 8)": 8.0}
    for name, r in report.items():
        print(f"{name:48s}{r['wall_s']['baseline']:11.3f}s{r['wall_s']['per_call']:9.3f}s{r['ratio']:7.2f}x  "
              f"{r['all_ratios']}  {r['agreement_not_rewritten']}")
        print(f"{'  CPU ms per sample (all processes)':48s}{r['cpu_ms_per_sample']['baseline']:12.3f}"
              f"{r['cpu_ms_per_sample']['per_call']:10.3f}; fast path decided {r['fast_path_decided']}/{r['samples']}")
        if r["disagreements"]:
            print("  disagreements:", r["disagreements"])
        print(f"  {'PASS' if r['ratio'] >= goals[name] else 'MISS'}  >= {goals[name]:g}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"report": report, "load_avg": [load, load_after]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
