"""The whole evalkit path on a CPU-only machine, in one command: ``python -m rlhf_ext.tours.quickstart``.

1. builds a tiny random Qwen2 model and tokenizer locally (no model hub);
2. runs ``evalkit math500`` on it with real vLLM: 8 problems x 4 samples x 64 tokens, graded by
   the rlhf_ext grader while vLLM decodes, recorded per sample, resumable;
3. prints the summary (avg@n, pass@k, maj@n with bootstrap intervals) and where the files are.

Problems come from ``../shared/data/math500.jsonl`` when that file exists (the project's
checkout layout), else from eight small problems bundled here. The model's weights are random,
so its accuracy is (almost surely) 0: the point is that every stage runs. Point ``evalkit`` at a
real checkpoint for real numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# Written for this demo (not taken from a benchmark): short questions with integer answers.
BUNDLED_PROBLEMS = [
    ("q1", "What is $17 + 25$?", "42"),
    ("q2", "A box holds 6 rows of 8 eggs. How many eggs does it hold?", "48"),
    ("q3", "What is the remainder when $100$ is divided by $7$?", "2"),
    ("q4", "Compute $2^{10} - 1000$.", "24"),
    ("q5", "The sum of two numbers is 30 and their difference is 4. What is the larger number?", "17"),
    ("q6", "How many positive divisors does $36$ have?", "9"),
    ("q7", "What is the least common multiple of $4$ and $6$?", "12"),
    ("q8", "A rectangle has perimeter 20 and width 3. What is its area?", "21"),
]
SHARED_MATH500 = Path("../shared/data/math500.jsonl")


def bundled_data(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for pid, problem, answer in BUNDLED_PROBLEMS:
            f.write(json.dumps({"id": pid, "problem": problem, "answer": answer}) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.tours.quickstart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="where the tiny model and the run go (default: a new temp dir)")
    parser.add_argument("--data", type=Path, help="MATH-500-style JSONL (default: ../shared/data/math500.jsonl if "
                                                  "present, else 8 bundled problems)")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from rlhf_ext.evalkit import RunOptions, run_eval
    from rlhf_ext.evalkit.records import SUMMARY_MD
    from rlhf_ext.evalkit.tiny_model import build_tiny_model

    work = args.workdir or Path(tempfile.mkdtemp(prefix="rlhf_ext_quickstart_"))
    work.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"[1/3] building a tiny random Qwen2 model in {work / 'tiny-qwen2'}")
    model = build_tiny_model(work / "tiny-qwen2", seed=0)
    data = args.data or (SHARED_MATH500 if SHARED_MATH500.is_file() else bundled_data(work / "problems.jsonl"))
    data = data.resolve()
    say(f"[2/3] evalkit math500 on {data}: {args.limit} problems x {args.n_samples} samples x {args.max_tokens} "
        "tokens with vLLM (the engine takes ~30 s to start on CPU)")
    output, _ = run_eval(RunOptions(suite="math500", model=str(model), data=[str(data)], limit=args.limit,
                                    n_samples=args.n_samples, max_tokens=args.max_tokens, output=work / "run"),
                         log=say)
    say("[3/3] summary")
    print((output / SUMMARY_MD).read_text(encoding="utf-8"))
    print(f"Run directory: {output} (config.json, samples.jsonl, summary.json, summary.md).")
    print("The weights are random, so 0% is the expected score. Next:")
    print(f"  evalkit report {output}")
    print(f"  evalkit math500 --model {model} --data {data} --limit {args.limit} --n-samples {args.n_samples} "
          f"--max-tokens {args.max_tokens} --output {output}   # resumes: nothing left to generate")
    print("  evalkit aime --model YOUR_CHECKPOINT --dp 8        # the DeepSeek-R1 protocol, 64 samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
