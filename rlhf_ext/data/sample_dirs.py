"""Read a ``data sample`` (or any evalkit) run directory back as one group of samples per prompt.

The run directory is evalkit's: ``config.json`` names the task and the JSONL it was read from,
``samples.jsonl`` holds one graded record per sample. The source rows are read again (and must
still hash to what was sampled) so that later commands can carry every original field along.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from rlhf_ext.evalkit import records as ek_records
from rlhf_ext.evalkit.tasks import TASKS, DataError, custom_task, load_task

from .io import DataToolError, read_jsonl


@dataclass
class PromptGroup:
    """One prompt, its gold answer, the source row and its graded samples (by sample index)."""

    id: str
    problem: str
    gold: str
    row: dict
    prompt: str = ""  # the rendered prompt the samples were generated from
    samples: List[dict] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def correct(self) -> int:
        return sum(bool(s["correct"]) for s in self.samples)

    @property
    def pass_rate(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    @property
    def truncated(self) -> int:
        return sum(bool(s.get("truncated")) for s in self.samples)

    def stats(self) -> dict:
        lengths = [int(s.get("response_tokens", 0)) for s in self.samples]
        return {
            "id": self.id,
            "n": self.n,
            "correct": self.correct,
            "pass_rate": round(self.pass_rate, 6) if self.n else None,
            "truncated": self.truncated,
            "len_mean": round(statistics.fmean(lengths), 2) if lengths else None,
            "len_min": min(lengths) if lengths else None,
            "len_max": max(lengths) if lengths else None,
        }


@dataclass
class SampledRun:
    path: Path
    config: dict
    task: str
    n_samples: int
    groups: List[PromptGroup]

    @property
    def incomplete(self) -> int:
        return sum(1 for g in self.groups if g.n < self.n_samples)


def load_sample_dir(path) -> SampledRun:
    path = Path(path)
    cfg_path = path / ek_records.CONFIG_FILE
    if not cfg_path.is_file():
        raise DataToolError(f"{path}: not a sample directory (no {ek_records.CONFIG_FILE}); "
                            "create one with 'rlhf-ext data sample'")
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    tasks = config.get("tasks") or []
    if len(tasks) != 1:
        raise DataToolError(f"{path}: holds {len(tasks)} tasks ({', '.join(tasks)}); the data tools read one")
    name = tasks[0]
    if config.get("generation", {}).get("shuffle_options") is not None:
        # each answer's letters refer to its own prompt's option order: no one prompt per problem to pair with
        raise DataToolError(f"{path}: was sampled with --shuffle-options; the data tools need the options in one "
                            "order per prompt (sample without shuffling)")
    spec = config.get("custom_task")
    task = custom_task(**spec) if spec else TASKS.get(name)
    if task is None:
        raise DataToolError(f"{path}: unknown task {name!r}")
    source = config["datasets"][name]["source"]
    if str(source).startswith("hub:"):
        raise DataToolError(f"{path}: was sampled from {source}; the data tools need a local JSONL source")
    try:
        data = load_task(name, Path(source), task=task)
    except (DataError, OSError) as exc:
        raise DataToolError(f"{path}: cannot read its source {source}: {exc}") from None
    if data.sha256 != config["datasets"][name]["sha256"]:
        raise DataToolError(f"{path}: its source {source} changed since it was sampled (dataset hash differs); "
                            "sample again")
    rows = read_jsonl(source)
    by_id: Dict[str, PromptGroup] = {}
    wanted = set(config["datasets"][name]["problem_ids"])
    groups = []
    for problem, row in zip(data.problems, rows):
        if problem.id in wanted:
            g = PromptGroup(id=problem.id, problem=problem.text, gold=problem.gold, row=row)
            by_id[problem.id] = g
            groups.append(g)
    n_samples = int(config["n_samples"])
    for rec in ek_records.SampleLog(path / ek_records.SAMPLES_FILE).read():
        g = by_id.get(str(rec["problem_id"]))
        if g is not None and rec["task"] == name and 0 <= int(rec["sample_index"]) < n_samples:
            g.samples.append(rec)
            g.prompt = rec.get("prompt", g.prompt)
    for g in groups:
        g.samples.sort(key=lambda r: int(r["sample_index"]))
    return SampledRun(path=path, config=config, task=name, n_samples=n_samples, groups=groups)


def pass_rate_histogram(groups: List[PromptGroup], bins: int = 10) -> List[str]:
    """Text histogram of per-prompt pass rates: exactly 0 and exactly 1 get their own rows (always
    solved / never solved are what filtering acts on), the rest in ``bins`` equal-width bins."""
    rated = [g.pass_rate for g in groups if g.n]
    if not rated:
        return ["  (no graded prompts)"]
    counts = [0] * bins
    for r in rated:
        if 0.0 < r < 1.0:
            counts[min(int(r * bins), bins - 1)] += 1
    rows = [("acc = 0", sum(1 for r in rated if r == 0.0))]
    rows += [(f"{'(' if i == 0 else '['}{i / bins:.1f}, {(i + 1) / bins:.1f})", c) for i, c in enumerate(counts)]
    rows.append(("acc = 1", sum(1 for r in rated if r == 1.0)))
    width = max(c for _, c in rows) or 1
    return [f"  {label:<12} {count:>7}  {'#' * round(40 * count / width)}" for label, count in rows]


def prompt_messages(run: SampledRun, group: PromptGroup) -> List[dict]:
    """The chat messages the samples' prompt was rendered from (system prompt and template included),
    so that a chat-template trainer sees the same context the answers were sampled in."""
    from rlhf_ext.evalkit.templates import BOXED_INSTRUCTION

    gen = run.config.get("generation", {})
    template, system = gen.get("template"), gen.get("system_prompt")
    if template == "none":
        raise DataToolError(f"{run.path} was sampled with --template none (no chat); write plain text (--text)")
    messages = []
    if template == "qwen25-math-cot":
        messages.append({"role": "system", "content": system or BOXED_INSTRUCTION})
    elif system:
        messages.append({"role": "system", "content": system})
    user = f"{group.problem}\n{BOXED_INSTRUCTION}" if template == "r1" else group.problem
    messages.append({"role": "user", "content": user})
    return messages


def unique_responses(samples: List[dict]) -> List[dict]:
    """``samples`` without repeated responses (the first of each kept, in order)."""
    seen, out = set(), []
    for s in samples:
        if s["response"] not in seen:
            seen.add(s["response"])
            out.append(s)
    return out


def response_tokens(s: dict) -> int:
    """A sample's response length in tokens (its characters when the record has no token count)."""
    return int(s.get("response_tokens", len(s["response"])))
