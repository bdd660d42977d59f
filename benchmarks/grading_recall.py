"""Precision and recall of math graders on a labelled corpus of real model outputs.

Usage (from the repository root)::

    .venv/bin/python benchmarks/grading_recall.py [--qwen-python PY --qwen-eval-dir DIR] [--show N] [--json out.json]

The corpus is ``tests/data/graded_responses.jsonl.gz`` (its origin, licences and labels:
``tests/data/SOURCES.md``): 800 Qwen2.5-Math-7B-Instruct responses to 100 MATH problems
(Qwen2.5-Math's ``math_cot_100.jsonl``) and 600 GPT-3 responses to 150 GSM8K problems (OpenAI's
``example_model_solutions.jsonl``), each labelled right or wrong. The graders:

- ``rlhf_ext eval``: ``MathGrader(require_anchor=False)``, evalkit's grader;
- ``rlhf_ext reward``: ``MathGrader(require_anchor=True)``, the training reward (an answer counts only
  when stated with an anchor such as ``\\boxed{}`` or "the answer is"; GSM8K's "A: 18" is no anchor,
  so its recall there is low by design);
- ``math-verify``: as its README calls it, ``verify(parse(gold), parse(response))`` with the default
  extraction configs, in the main thread with its own timeouts;
- ``qwen math_equal``: Qwen2.5-Math's evaluation harness (``extract_answer(response, data)``, then
  ``math_equal(pred, gold)``), run in its own Python, because it needs sympy 1.12 and its bundled
  latex2sympy with antlr 4.11. It is never copied into this repository; to get it::

      git clone https://github.com/QwenLM/Qwen2.5-Math /tmp/qwen25math   # its evaluation/ is MIT
      python3 -m venv /tmp/qwen-venv
      /tmp/qwen-venv/bin/pip install sympy==1.12 antlr4-python3-runtime==4.11.1 word2number regex numpy
      /tmp/qwen-venv/bin/pip install --no-deps -e /tmp/qwen25math/evaluation/latex2sympy
      ... --qwen-python /tmp/qwen-venv/bin/python --qwen-eval-dir /tmp/qwen25math/evaluation

  Without these options its row is left out.

More real outputs, read in place from the sources (never copied into the repository; session 15):

- ``--tora FILE [FILE ...]``: ToRA's GSM8K outputs, 1,319 tool-integrated responses per model
  (microsoft/ToRA, MIT, ``src/outputs/llm-agents/<model>/gsm8k/test_tora_-1_seed0_t0.0_s0_e1319.jsonl``
  for ``tora-70b-v1.0`` and ``tora-code-34b-v1.0``): a program, its printed output, a conclusion,
  mostly with a boxed answer. ToRA stores its harness's extracted answer (``pred``), not its score;
  the label is that answer compared with the gold as numbers (thousands commas dropped), which
  reproduces ToRA's own ``.metrics`` (84.3% and 80.5% against its 80.7%: ToRA's ``math_equal`` also
  accepts a percentage's number /100 or x100);
- ``--gsm8k-examples FILE``: grade-school-math's ``example_model_solutions.jsonl`` problems 151 to
  1,319 (the first 150 are in the packaged corpus), 4,676 GPT-3 responses with OpenAI's labels.

- ``--hardverify FILE``: TinyV's HardVerify-Math (uw-nsl/TinyV, MIT, ``benchmarks/HardVerify-Math.json``,
  arXiv 2505.14625): 250 problems (OlympiadBench, cn_k12, orca_math, MATH-500, ...), each with a
  right answer in a form rule verifiers miss (``fn_output``) and a wrong one (``tn_output``), final
  answers only; graded as ``The final answer is $\\boxed{X}$.`` (``HARDVERIFY_LABEL_FIXES``: one
  "wrong" answer that is the gold's set).

``tests/data/tora_gsm8k_responses.jsonl.gz`` is a labelled extract of the ToRA outputs (rebuild:
``--build-tora FILE FILE``), which ``tests/test_rewards_recall_classes.py`` grades.

The labels of the MATH part were made by that same harness; every disagreement between the graders
was read by hand and the labels found wrong were corrected (``source_label`` keeps the original), so
no grader is right by construction. ``--show N`` prints up to N disagreements per grader with the
gold, the label and each grader's verdict.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "tests", "data", "graded_responses.jsonl.gz")
TORA_EXTRACT = os.path.join(REPO, "tests", "data", "tora_gsm8k_responses.jsonl.gz")


def load_corpus(path: str = CORPUS):
    """[{"id", "dataset", "gold", "response", "source_label", "label"}] from the gzipped JSON lines."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Labels of the sources found wrong by reading the response (id -> corrected label, why); SOURCES.md lists them.
LABEL_FIXES = {
    # Boxed 10000 against the gold 10{,}000: the same number; Qwen's math_equal cannot read the gold's
    # LaTeX thousands separator, so its harness scored this right answer wrong.
    "math-72-7": (True, "boxed 10000 is the gold 10{,}000; Qwen's math_equal misreads the gold's {,} separator"),
}
# ToRA's GSM8K outputs (session 15), read by hand where a grader disagreed with the label.
TORA_LABEL_FIXES = {
    # "What is the school's overall pass rate?", gold 70 (per cent): the rate 0.7 is the same rate.
    # No rule grader accepts it without reading the question (a gold 5 does not accept 0.05).
    "tora-806-tora-code-34b-v1.0": (True, "pass rate 0.7 is the gold's 70 (%); only the question says so"),
}
HARDVERIFY_LABEL_FIXES = {
    # f(f(f(x))) = 3 for f(x) = x^2 - 2x: its "wrong" answer is the gold's five numbers written as a set
    "hv-52-tn": (True, "\\{-1, 1, 3, 1 - \\sqrt{2}, 1 + \\sqrt{2}\\} is the gold 3, 1, -1, 1+\\sqrt{2}, 1-\\sqrt{2}"),
}
GSM8K_PROBLEMS = 150
GSM8K_MODELS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


def build_corpus(qwen_jsonl: str, gsm_jsonl: str, out: str = CORPUS) -> int:
    """Write the corpus from the two source files (see tests/data/SOURCES.md); returns its row count."""
    import re

    rows = []
    with open(qwen_jsonl, encoding="utf-8") as f:
        for line in f:
            src = json.loads(line)
            for j, (response, score) in enumerate(zip(src["code"], src["score"])):
                rows.append({"id": f"math-{src['idx']}-{j}", "dataset": "math", "gold": src["gt"],
                             "response": response, "source_label": bool(score)})
    with open(gsm_jsonl, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= GSM8K_PROBLEMS:
                break
            src = json.loads(line)
            gold = re.search(r"A: (.*)$", src["ground_truth"].strip()).group(1).strip()
            for model in GSM8K_MODELS:
                rows.append({"id": f"gsm8k-{i}-{model}", "dataset": "gsm8k", "gold": gold,
                             "response": src[model]["solution"], "source_label": bool(src[model]["is_correct"])})
    for r in rows:
        r["label"] = LABEL_FIXES[r["id"]][0] if r["id"] in LABEL_FIXES else r["source_label"]
    unknown = set(LABEL_FIXES) - {r["id"] for r in rows}
    if unknown:
        raise SystemExit(f"LABEL_FIXES names rows that are not in the corpus: {sorted(unknown)}")
    with gzip.GzipFile(out, "wb", mtime=0) as f:  # mtime 0: the same sources give the same bytes
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    return len(rows)


def _number(text):
    """A decimal number as written (thousands commas dropped), or None; string work only."""
    from fractions import Fraction

    try:
        return Fraction(str(text).replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def _tora_model(path: str) -> str:
    """``.../llm-agents/tora-70b-v1.0/gsm8k/test_....jsonl`` -> ``tora-70b-v1.0`` (else the file's name)."""
    parts = os.path.normpath(path).split(os.sep)
    return parts[-3] if len(parts) >= 3 and parts[-2] == "gsm8k" else os.path.basename(path).split(".jsonl")[0]


def load_tora(paths, problems=None):
    """Rows of ToRA's GSM8K output files (see the docstring): the label is ToRA's extracted answer
    equal, as a number, to the gold. ``problems``: keep only these problem indices."""
    rows = []
    for path in paths:
        model = _tora_model(path)
        with open(path, encoding="utf-8") as f:
            for line in f:
                src = json.loads(line)
                if problems is not None and src["idx"] not in problems:
                    continue
                pred, gold = _number(src["pred"][0]), _number(src["gt"])
                rows.append({"id": f"tora-{src['idx']}-{model}", "dataset": "tora-gsm8k", "gold": src["gt"],
                             "response": src["code"][0], "source_label": pred is not None and pred == gold})
    for r in rows:
        r["label"] = TORA_LABEL_FIXES[r["id"]][0] if r["id"] in TORA_LABEL_FIXES else r["source_label"]
    return rows


# The extract: every 10th problem, and every problem where a grader disagreed with the label on the
# full outputs (a percentage written "50.0\%", a conclusion after the program's output without an
# anchor, a gold with thousands commas), with both models' responses.
TORA_EXTRACT_PROBLEMS = frozenset(range(0, 1319, 10)) | {
    14, 98, 118, 191, 230, 249, 288, 367, 458, 505, 610, 630, 640, 642, 718, 728, 760, 772, 806, 819, 829,
    890, 997, 1009, 1079, 1159, 1206}


def build_tora_extract(paths, out: str = TORA_EXTRACT) -> int:
    """Write the labelled extract of ToRA's outputs (tests/data/SOURCES.md); returns its row count."""
    rows = load_tora(paths, TORA_EXTRACT_PROBLEMS)
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    return len(rows)


def load_gsm8k_rest(path: str):
    """grade-school-math's example solutions to the problems the packaged corpus leaves out (151+)."""
    import re

    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < GSM8K_PROBLEMS:
                continue
            src = json.loads(line)
            gold = re.search(r"A: (.*)$", src["ground_truth"].strip()).group(1).strip()
            for model in GSM8K_MODELS:
                label = bool(src[model]["is_correct"])
                rows.append({"id": f"gsm8k-{i}-{model}", "dataset": "gsm8k-rest", "gold": gold,
                             "response": src[model]["solution"], "source_label": label, "label": label})
    return rows


def load_hardverify(path: str):
    """Rows of TinyV's HardVerify-Math (see the docstring): each problem's right and wrong answer, boxed."""
    with open(path, encoding="utf-8") as f:
        problems = json.load(f)
    rows = []
    for p in problems:
        for kind, label in (("fn", True), ("tn", False)):
            rows.append({"id": f"hv-{p['id']}-{kind}", "dataset": "hardverify", "gold": p["ground_truth"],
                         "response": "The final answer is $\\boxed{%s}$." % p[f"{kind}_output"],
                         "source_label": label})
    for r in rows:
        r["label"] = HARDVERIFY_LABEL_FIXES[r["id"]][0] if r["id"] in HARDVERIFY_LABEL_FIXES else r["source_label"]
    return rows


def grade_rlhf_ext(rows, require_anchor: bool):
    from rlhf_ext.rewards import MathGrader

    with MathGrader(require_anchor=require_anchor) as grader:
        results = grader.grade_batch([r["response"] for r in rows], [r["gold"] for r in rows])
    return [bool(x.correct) for x in results]


def grade_math_verify(rows):
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out, golds = [], {}
    for r in rows:
        if r["gold"] not in golds:
            golds[r["gold"]] = parse("$" + r["gold"] + "$")
        out.append(bool(verify(golds[r["gold"]], parse(r["response"]))))
    return out


def _qwen_child(eval_dir: str) -> None:
    """Child mode, in Qwen's Python: JSON lines {"response", "gold", "dataset"} in, one verdict a line out.

    As Qwen2.5-Math's harness does (``math_eval.py`` / ``evaluate.py``): the prediction is
    ``extract_answer(response, data_name)``, the gold ``strip_string(gold)``, the verdict
    ``math_equal(pred, gold)``."""
    sys.path.insert(0, eval_dir)
    from grader import math_equal  # noqa: E402  (Qwen's evaluation/grader.py)
    from parser import extract_answer, strip_string  # noqa: E402  (Qwen's evaluation/parser.py)

    for line in sys.stdin:
        row = json.loads(line)
        data_name = "gsm8k" if "gsm8k" in row["dataset"] else "math"
        try:
            ok = bool(math_equal(extract_answer(row["response"], data_name), strip_string(row["gold"]), timeout=True))
        except Exception:  # the harness scores a crash as wrong
            ok = False
        sys.stdout.write(json.dumps(ok) + "\n")
        sys.stdout.flush()


def grade_qwen(rows, python: str, eval_dir: str):
    for needed in ("grader.py", "parser.py"):
        if not os.path.isfile(os.path.join(eval_dir, needed)):
            raise SystemExit(f"--qwen-eval-dir {eval_dir!r} has no {needed}: pass Qwen2.5-Math's evaluation/ folder")
    payload = "".join(json.dumps({"response": r["response"], "gold": r["gold"], "dataset": r["dataset"]}) + "\n"
                      for r in rows)
    proc = subprocess.run([python, os.path.abspath(__file__), "--qwen-child", eval_dir], input=payload,
                          capture_output=True, text=True, cwd=eval_dir)
    verdicts = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or len(verdicts) != len(rows):
        raise SystemExit(f"Qwen's math_equal failed (rc={proc.returncode}, {len(verdicts)}/{len(rows)} verdicts):\n"
                         + proc.stderr[-3000:])
    return verdicts


def scores(verdicts, labels):
    """{"tp", "fp", "fn", "tn", "precision", "recall", "agreement"} of verdicts against labels."""
    tp = sum(v and lab for v, lab in zip(verdicts, labels))
    fp = sum(v and not lab for v, lab in zip(verdicts, labels))
    fn = sum(lab and not v for v, lab in zip(verdicts, labels))
    tn = len(labels) - tp - fp - fn
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
            "agreement": (tp + tn) / len(labels) if labels else 1.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--qwen-python", help="Python with Qwen2.5-Math's evaluation requirements (see the docstring)")
    ap.add_argument("--qwen-eval-dir", help="Qwen2.5-Math's evaluation/ folder (grader.py, parser.py)")
    ap.add_argument("--show", type=int, default=0, help="print up to N disagreements with the labels per grader")
    ap.add_argument("--json", help="write verdicts and scores here")
    ap.add_argument("--build", nargs=2, metavar=("MATH_COT_100_JSONL", "GSM8K_EXAMPLES_JSONL"),
                    help="rebuild the corpus from the source files (tests/data/SOURCES.md) and exit")
    ap.add_argument("--tora", nargs="+", metavar="FILE", help="also grade ToRA's GSM8K output files (docstring)")
    ap.add_argument("--gsm8k-examples", metavar="FILE",
                    help="also grade example_model_solutions.jsonl's problems 151+ (docstring)")
    ap.add_argument("--hardverify", metavar="FILE", help="also grade TinyV's HardVerify-Math.json (docstring)")
    ap.add_argument("--no-corpus", action="store_true", help="leave the packaged corpus out (only --tora etc.)")
    ap.add_argument("--build-tora", nargs="+", metavar="FILE",
                    help="rebuild tests/data/tora_gsm8k_responses.jsonl.gz from ToRA's output files and exit")
    ap.add_argument("--qwen-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.qwen_child:
        _qwen_child(args.qwen_child)
        return 0
    if args.build:
        print(f"wrote {build_corpus(*args.build, out=args.corpus)} rows to {args.corpus}")
        return 0
    if args.build_tora:
        print(f"wrote {build_tora_extract(args.build_tora)} rows to {TORA_EXTRACT}")
        return 0
    if bool(args.qwen_python) != bool(args.qwen_eval_dir):
        ap.error("--qwen-python and --qwen-eval-dir go together")
    for path in (args.tora or []) + [p for p in (args.gsm8k_examples, args.hardverify) if p]:
        if not os.path.isfile(path):
            ap.error(f"{path!r} is not a file (fetch the source first: see the docstring)")
    rows = [] if args.no_corpus else load_corpus(args.corpus)
    if args.tora:
        rows += load_tora(args.tora)
    if args.gsm8k_examples:
        rows += load_gsm8k_rest(args.gsm8k_examples)
    if args.hardverify:
        rows += load_hardverify(args.hardverify)
    if not rows:
        ap.error("nothing to grade: --no-corpus without --tora, --gsm8k-examples or --hardverify")
    graders = {"rlhf_ext eval": lambda: grade_rlhf_ext(rows, False),
               "rlhf_ext reward": lambda: grade_rlhf_ext(rows, True),
               "math-verify": lambda: grade_math_verify(rows)}
    if args.qwen_python:
        graders["qwen math_equal"] = lambda: grade_qwen(rows, args.qwen_python, args.qwen_eval_dir)
    verdicts, seconds = {}, {}
    for name, run in graders.items():
        t0 = time.perf_counter()
        verdicts[name] = run()
        seconds[name] = time.perf_counter() - t0
    datasets = sorted({r["dataset"] for r in rows})
    table = {}
    per_part = ", ".join(f"{d}: {sum(r['dataset'] == d for r in rows)}" for d in datasets)
    print(f"{len(rows)} responses ({per_part}), {sum(r['label'] for r in rows)} labelled right")
    print(f"{'grader':18s} {'part':10s} {'precision':>9s} {'recall':>7s} {'agree':>7s} {'FP':>4s} {'FN':>4s} "
          f"{'seconds':>8s}")
    for name, v in verdicts.items():
        for part in datasets + ["all"]:
            idx = [i for i, r in enumerate(rows) if part in ("all", r["dataset"])]
            s = scores([v[i] for i in idx], [rows[i]["label"] for i in idx])
            table[f"{name}/{part}"] = s
            sec = f"{seconds[name]:8.1f}" if part == "all" else ""
            print(f"{name:18s} {part:10s} {s['precision']:9.2%} {s['recall']:7.2%} {s['agreement']:7.2%} "
                  f"{s['fp']:4d} {s['fn']:4d} {sec:>8s}")
    names = list(verdicts)
    split = [i for i, r in enumerate(rows) if len({verdicts[n][i] for n in names}) > 1]
    print(f"graders disagree on {len(split)} responses; labels corrected by hand: "
          f"{sum(r['label'] != r['source_label'] for r in rows)}")
    if args.show:
        for name in names:
            wrong = [i for i in range(len(rows)) if verdicts[name][i] != rows[i]["label"]]
            print(f"\n== {name}: {len(wrong)} verdicts differ from the label")
            for i in wrong[:args.show]:
                r = rows[i]
                tail = r["response"][-160:].replace("\n", " ")
                others = ", ".join(f"{n}={int(verdicts[n][i])}" for n in names)
                print(f"  {r['id']}: gold {r['gold']!r} label {int(r['label'])} [{others}]\n      ...{tail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scores": table, "seconds": seconds,
                       "verdicts": {n: {rows[i]["id"]: verdicts[n][i] for i in range(len(rows))} for n in names}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
