"""Which verdicts a change to the grading rules changed, and why: this checkout against an older commit.

Usage (from the repository root)::

    .venv/bin/python benchmarks/grading_changes.py --old d4953b6 [--json out.json]

Both versions grade the same samples with the worker's exact code (``grade_response``, in one
process each, math-verify's own timeouts on): the corpora of ``benchmarks/rewards_throughput.py``
(its fixed mix of right, wrong, equivalent, misread and unparseable answers; the GRPO-style groups;
the MATH-500-style responses) and every MATH-500 problem graded against its full reference solution
as the gold (the gold then comes from the solution's boxes). The new version grades each sample in
both modes (``require_anchor=True``, the rewards' and the old code's only mode, and ``False``,
evaluation's). Each changed verdict is put down to the rule that produced it (several boxes, a
number spelling, a phrase anchor, the fallback without an anchor), and each changed verdict is
checked against the corpus's truth where the corpus knows it, and against math-verify as its own
test suite calls it (every box, the fallback without an anchor).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = {"correct": True, "equivalent": True, "misread": True, "wrong": False, "unparseable": False}


def corpus(data_dir: str):
    """[(response, gold, kind)]: the throughput benchmark's corpora and MATH-500 against its solutions."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import rewards_throughput as rt

    out = [c for c in rt.build_corpus(data_dir) if c[2] != "pathological"]
    out += [(t, g, k) for _, t, g, k in rt.group_corpus(data_dir)]
    out += [(t, g, k) for _, t, g, k in rt.math500_corpus(data_dir)]
    for row in rt._rows(data_dir, "math500.jsonl"):
        out.append(("So the answer is $\\boxed{%s}$." % row["answer"], row["solution"], "correct"))
    return out


def _grade_child(samples_path: str, modes: str) -> None:
    """Child mode: grade the samples with the rlhf_ext found first on sys.path; JSON lines out."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from rlhf_ext.rewards import extraction
    from rlhf_ext.rewards.extraction import find_answer_candidate, prepare_gold
    from rlhf_ext.rewards.math_verify_recipe import grade_response

    with open(samples_path) as f:
        samples = json.load(f)
    import time

    gold_cache, out, seconds = {}, [], {}
    for response, gold in samples:
        row = {}
        for mode in modes.split(","):
            kwargs = {} if mode == "old" else {"require_anchor": mode == "reward"}
            start = time.perf_counter()
            gold_text = prepare_gold(gold)
            result = grade_response(response, gold_text, gold_cache, **kwargs)
            seconds[mode] = seconds.get(mode, 0.0) + time.perf_counter() - start
            cand = find_answer_candidate(response, **kwargs)
            row[mode] = {"correct": result["correct"], "extracted": result["extracted"], "gold": gold_text,
                         "source": cand.source if cand else None, "raw": cand.raw if cand else None}
            if hasattr(extraction, "find_final_boxes"):
                row[mode]["boxes"] = len(extraction.find_final_boxes(response))
                row[mode]["gold_boxes"] = len(extraction.find_final_boxes(gold)) if isinstance(gold, str) else 0
        out.append(row)
    json.dump({"rows": out, "seconds": seconds}, sys.stdout)


def _run(root: str, samples_path: str, modes: str):
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", samples_path, modes], env=env,
                          capture_output=True, text=True, cwd=root, check=True)
    return json.loads(proc.stdout)


def reason(old: dict, new: dict) -> str:
    """The rule that changed a verdict (the first that applies)."""
    if new.get("gold_boxes", 0) > 1 or (old["gold"] != new["gold"]):
        return "gold with several boxes"
    if new.get("boxes", 0) > 1:
        return "answer with several boxes"
    if new["source"] == "fallback" and old["source"] is None:
        return "no anchor: last expression (evaluation mode)"
    if new["source"] == "phrase" and new["raw"] != old["raw"]:
        return "phrase anchor: the sentence's math"
    if new["raw"] == old["raw"]:
        return "number spelling (same answer text, read differently)"
    return "other extraction change"


def reference(response: str, gold) -> bool:
    """math-verify as its test suite and lighteval call it (every box, the fallback without an anchor);
    the gold as ``$gold$`` unless it has a box. Only for this fixed corpus: ``ExprExtractionConfig``
    runs sympy's parser on the text."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = str(gold)
    gold = gold if "\\boxed" in gold or "####" in gold else f"${gold}$"
    if "####" in gold:
        gold = "$" + gold.rsplit("####", 1)[1].strip().replace(",", "") + "$"
    return bool(verify(parse(gold, config), parse(response, config), float_rounding=6, strict=True))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=False, help="the commit to compare with (e.g. main before the change)")
    parser.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"), help="benchmark data folder")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        _grade_child(*args._child)
        return 0
    if not args.old:
        parser.error("--old COMMIT is required")
    samples = corpus(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        old_root = os.path.join(tmp, "old")
        os.makedirs(old_root)
        archive = os.path.join(tmp, "old.tar")
        subprocess.run(["git", "archive", "-o", archive, args.old, "rlhf_ext"], cwd=REPO, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(old_root)
        samples_path = os.path.join(tmp, "samples.json")
        with open(samples_path, "w") as f:
            json.dump([[r, g] for r, g, _ in samples], f)
        old = _run(old_root, samples_path, "old")
        new = _run(REPO, samples_path, "reward,evaluation")
    # grading time in one process, sequential, gold cache on (the first mode of a process pays for
    # the gold parses): a cost comparison of the rules, not a throughput benchmark
    report = {"samples": len(samples), "old": args.old,
              "grading_seconds": {"old": round(old["seconds"]["old"], 2),
                                  **{k: round(v, 2) for k, v in new["seconds"].items()}}}
    print(f"grading time, sequential in one process: {report['grading_seconds']} (the first mode of each "
          "process also parses the golds)")
    old, new = old["rows"], new["rows"]
    for mode in ("reward", "evaluation"):
        changed = Counter()
        direction = Counter()
        vs_truth = Counter()
        examples = {}
        right = {"old": 0, "new": 0}
        for (response, gold, kind), o, n in zip(samples, old, new):
            o, n = o["old"], n[mode]
            right["old"] += o["correct"]
            right["new"] += n["correct"]
            if o["correct"] == n["correct"]:
                continue
            why = reason(o, n)
            changed[why] += 1
            direction[f"{'wrong->right' if n['correct'] else 'right->wrong'}"] += 1
            truth = TRUTH.get(kind)
            if truth is not None:
                vs_truth["now agrees with the truth" if n["correct"] == truth else "now disagrees with the truth"] += 1
            vs_truth["agrees with math-verify" if reference(response, gold) == n["correct"]
                     else "differs from math-verify"] += 1
            examples.setdefault(why, (response[-100:], str(gold)[-60:], o["correct"], n["correct"]))
        report[mode] = {"verdicts_changed": sum(changed.values()), "by_reason": dict(changed),
                        "direction": dict(direction), "against_corpus_truth": dict(vs_truth),
                        "correct_old": right["old"], "correct_new": right["new"], "examples": examples}
        print(f"{mode} mode vs {args.old} (anchor required): {sum(changed.values())} of {len(samples)} verdicts "
              f"changed; correct {right['old']} -> {right['new']}")
        for why, count in changed.most_common():
            print(f"  {count:5d}  {why}   e.g. {examples[why]}")
        print(f"  direction {dict(direction)}; the new verdicts against the corpus's truth and math-verify: "
              f"{dict(vs_truth)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
