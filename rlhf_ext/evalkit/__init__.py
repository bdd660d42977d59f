"""evalkit: math benchmark evaluation (AIME, MATH-500, GSM8K, AMC23) on vLLM with honest statistics.

Command line: ``evalkit {aime,aime24,aime25,math500,gsm8k,amc23} --model PATH``, ``evalkit list``,
``evalkit report RUN_DIR``, ``evalkit compare RUN_A RUN_B`` (also ``python -m rlhf_ext.evalkit``);
``evalkit run --data FILE --name NAME [--answer-type choice|ranking]`` for any JSONL of math,
multiple-choice or ranking problems. See docs/evalkit.md.

Python API::

    from rlhf_ext.evalkit import RunOptions, run_eval, compare_runs
    out_dir, summary = run_eval(RunOptions(suite="math500", model="ckpt", n_samples=4,
                                           data=["../shared/data/math500.jsonl"], limit=8))

Importing this package is cheap: vLLM, Ray and the grader load only when a run starts.
"""

from .metrics import (G_PASS_THRESHOLDS, PairedDifference, bootstrap_ci, bootstrap_indices, cluster_answers,
                      g_pass_at_k, majority_vote, mg_pass_at_k, paired_difference, pass_at_k, pass_k_values)
from .records import RunDirError, SampleLog
from .summary import compare_runs, render_compare_markdown, render_markdown, report, summarize
from .runner import EvalInterrupted, RunOptions, option_permutation, problem_seed, run_eval
from .tasks import SUITES, TASKS, DataError, Problem, Task, load_task
from .templates import TEMPLATES, TemplateError, render_prompt
from .tiny_model import build_tiny_model, build_tiny_tokenizer
from .voting import AnswerEquivalence

__all__ = [
    "RunOptions", "run_eval", "EvalInterrupted", "problem_seed", "option_permutation",
    "report", "summarize", "render_markdown", "compare_runs", "render_compare_markdown",
    "pass_at_k", "pass_k_values", "g_pass_at_k", "mg_pass_at_k", "G_PASS_THRESHOLDS", "majority_vote", "cluster_answers", "AnswerEquivalence", "bootstrap_ci", "bootstrap_indices", "paired_difference",
    "PairedDifference",
    "SampleLog", "RunDirError",
    "TASKS", "SUITES", "Task", "Problem", "load_task", "DataError",
    "TEMPLATES", "render_prompt", "TemplateError",
    "build_tiny_model", "build_tiny_tokenizer",
]

# Verdicts at the experiment's resolution and the grader audit (issue 24).
from .audit import run_audit  # noqa: E402
from .resolution import MinEffect, min_effect, seed_spread, verdict  # noqa: E402

__all__ += ["run_audit", "MinEffect", "min_effect", "seed_spread", "verdict"]
