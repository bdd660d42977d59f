"""``data sample``: N graded samples per training prompt, with evalkit's engine.

A sample directory *is* an evalkit run directory over a custom task (``evalkit run --data FILE``):
vLLM generation (``--tp``/``--dp`` as in evalkit), seeded per prompt and sample, graded by
rlhf_ext's ``MathGrader`` while vLLM decodes, one record per sample in ``samples.jsonl``, and
resumable (rerun the same command; only missing samples are generated). On top of the run it
writes ``prompts.jsonl``: one row per prompt with pass rate, mean/min/max response length and
the number of truncated samples, which ``data filter|pairs|sft`` read back.

Defaults suit training data rather than benchmarks: the bare problem in the model's chat
template (what ``--data.apply_chat_template`` gives OpenRLHF), temperature 1, top_p 1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

from .io import DataToolError
from .sample_dirs import load_sample_dir, pass_rate_histogram

PROMPTS_FILE = "prompts.jsonl"


def default_task_name(data: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(data).stem).lstrip("_.-") or "data"
    return name[:64]


def sample(*, model: str, data: Path, output: Path, name: Optional[str] = None, n_samples: int = 8,
           problem_key: Optional[str] = None, answer_key: Optional[str] = None, id_key: Optional[str] = None,
           answer_type: Optional[str] = None, template: str = "chat", system_prompt: Optional[str] = None,
           temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0, max_tokens: int = 1024,
           seed: int = 0, tp: int = 1, dp: int = 1,
           limit: Optional[int] = None, ray_address: Optional[str] = None,
           gpu_memory_utilization: Optional[float] = None, enforce_eager: Optional[bool] = None,
           max_model_len: Optional[int] = None, dtype: str = "auto", grader_workers: Optional[int] = None,
           grade_timeout: float = 5.0, require_anchor: Optional[bool] = None, progress: bool = True,
           log: Callable[[str], None] = print) -> dict:
    """Sample and grade; write ``output`` (an evalkit run directory plus ``prompts.jsonl``); return
    ``{"prompts", "samples", "accuracy", "truncated", "incomplete"}``.

    ``require_anchor``: as :class:`~rlhf_ext.rewards.MathGrader`'s; None takes a resumed directory's
    own setting, else False (evalkit's default: an answer without an anchor is graded on the
    response's last math expression). True grades as the training reward does, which is the choice
    when the pass rates are to pick prompts for that reward."""
    from rlhf_ext.evalkit.records import write_text_atomic
    from rlhf_ext.evalkit.runner import RunOptions, run_eval

    if output is None:
        raise DataToolError("--output DIR is required")
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise DataToolError(f"--output {output} is a file; it must be a (new or resumable) sample directory")
    name = name or default_task_name(data)
    if require_anchor is None:
        config = output / "config.json"
        # a directory sampled before the option existed was graded with the anchor required
        require_anchor = bool(_read_json(config).get("grading", {}).get("require_anchor", True)) \
            if config.exists() else False
    options = RunOptions(
        suite=name, model=model, output=output, n_samples=n_samples, temperature=temperature, top_p=top_p,
        top_k=top_k, min_p=min_p, max_tokens=max_tokens, template=template, system_prompt=system_prompt, seed=seed, tp=tp, dp=dp,
        limit=limit, data=[str(data)], ray_address=ray_address, gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager, max_model_len=max_model_len, dtype=dtype, grader_workers=grader_workers,
        grade_timeout=grade_timeout, require_anchor=require_anchor, progress=progress,
        custom_task={"name": name, "problem_key": problem_key, "answer_key": answer_key, "id_key": id_key,
                     "answer_type": answer_type or "math"},
    )
    run_eval(options, log=log)
    run = load_sample_dir(output)
    import json

    lines = [json.dumps({**g.stats(), "gold": g.gold}, ensure_ascii=False) for g in run.groups]
    write_text_atomic(output / PROMPTS_FILE, "\n".join(lines) + "\n")
    samples = sum(g.n for g in run.groups)
    correct = sum(g.correct for g in run.groups)
    truncated = sum(g.truncated for g in run.groups)
    result = {"prompts": len(run.groups), "samples": samples, "accuracy": correct / samples if samples else 0.0,
              "truncated": truncated, "incomplete": run.incomplete}
    lengths = [int(s.get("response_tokens", 0)) for g in run.groups for s in g.samples]
    log(f"data sample: {result['prompts']} prompts x {n_samples} samples = {samples} graded samples in {output}")
    log(f"  accuracy {result['accuracy']:.1%}, truncated {truncated} ({truncated / max(samples, 1):.1%}), "
        f"response tokens mean {sum(lengths) / max(len(lengths), 1):.1f} / min {min(lengths, default=0)} / "
        f"max {max(lengths, default=0)}")
    log("  pass rate per prompt:")
    for line in pass_rate_histogram(run.groups):
        log(line)
    log(f"  per-prompt table: {output / PROMPTS_FILE}")
    return result


def _read_json(path: Path) -> dict:
    from rlhf_ext.evalkit.records import read_json

    try:
        value = read_json(path)
    except Exception as exc:
        raise DataToolError(f"cannot read {path}: {exc}") from None
    return value if isinstance(value, dict) else {}
