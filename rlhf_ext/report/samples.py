"""The report's sample viewer, data side: answers from run records and evalkit directories, bounded.

Sources: each run's ``rollout_samples.jsonl`` (docs/run_records.md; one view per step) and each
evalkit directory's ``samples.jsonl`` (one view per task; an evaluation placed on a run's step axis
is named after that run and step). The page picks a view, filters by reward and truncation, and can
put a second view beside the first, matched by prompt (:func:`rlhf_ext.runs.prompt_id`): the same
prompt at two steps, or a training step beside an evaluation.

An evalkit answer's reward is its correctness (1 or 0); its components are ``correct`` and, for
choice and ranking tasks, ``top1_correct`` and ``rank_tau``; ``extracted`` and ``gold`` are shown.

Size: prompt texts are stored once; the page keeps at most :data:`SAMPLE_BUDGET_BYTES` of answers,
shared equally by the sources, taking the views of a source in turn (so every step keeps some
answers) and cutting texts at :data:`TEXT_CHARS`; what is left out is counted in a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..runs import ROLLOUT_SAMPLES, prompt_id, read_rollout_samples

SAMPLE_BUDGET_BYTES = 2 * 1024 * 1024
"""Answers embedded in one report page, all sources together (JSON bytes, prompts included)."""
TEXT_CHARS = 3000
"""Longest prompt / response text the page keeps."""


@dataclass
class SampleView:
    """One pickable view: a step of a run, or a task of an evaluation."""

    label: str
    answers: List[Dict[str, Any]]
    step: Optional[int] = None


@dataclass
class SampleSource:
    name: str
    kind: str  # "run" or "eval"
    views: List[SampleView] = field(default_factory=list)


def _finite(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf") else None


def run_source(name: str, run_dir: Path, warnings: Optional[List[str]] = None) -> Optional[SampleSource]:
    """The rollout samples of one run record, a view per step (``None`` when it recorded none)."""
    records = read_rollout_samples(Path(run_dir) / ROLLOUT_SAMPLES, warnings)
    if not records:
        return None
    by_step: Dict[int, List[Dict[str, Any]]] = {}
    for rec in records:
        comps = rec.get("components") if isinstance(rec.get("components"), dict) else {}
        by_step.setdefault(rec["step"], []).append({
            "prompt": rec["prompt"], "response": rec["response"], "reward": _finite(rec.get("reward")),
            "advantage": _finite(rec.get("advantage")), "truncated": rec.get("truncated"),
            "tokens": rec.get("response_tokens"), "components": {k: _finite(v) for k, v in comps.items()},
            "gold": rec.get("label"), "clipped": rec.get("clipped")})
    return SampleSource(name, "run", [SampleView(f"step {s}", by_step[s], s) for s in sorted(by_step)])


def eval_source(name: str, eval_dir: Path) -> Optional[SampleSource]:
    """The answers of one evalkit directory, a view per task (``None`` when it has none)."""
    from ..evalkit.records import SAMPLES_FILE, RunDirError, SampleLog

    try:
        records = SampleLog(Path(eval_dir) / SAMPLES_FILE).read()
    except RunDirError:
        return None
    if not records:
        return None
    by_task: Dict[str, List[Dict[str, Any]]] = {}
    for rec in records:
        correct = bool(rec.get("correct"))
        comps = {"correct": float(correct)}
        for key in ("top1_correct", "rank_tau"):
            if rec.get(key) is not None:
                comps[key] = _finite(float(rec[key]))
        by_task.setdefault(str(rec.get("task")), []).append({
            "prompt": str(rec.get("prompt") or f"(problem {rec.get('problem_id')}: prompt not recorded)"),
            "response": str(rec.get("response") or ""),
            "reward": float(correct), "advantage": None, "truncated": rec.get("truncated"),
            "tokens": rec.get("response_tokens"), "components": comps, "gold": _text(rec.get("gold")),
            "extracted": _text(rec.get("extracted")), "sample_index": rec.get("sample_index")})
    return SampleSource(name, "eval", [SampleView(f"task {t}", by_task[t]) for t in sorted(by_task)])


def _text(value) -> Optional[str]:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _clip(text: Optional[str]) -> Tuple[Optional[str], int]:
    if text is None or len(text) <= TEXT_CHARS:
        return text, 0
    return text[:TEXT_CHARS], len(text) - TEXT_CHARS


def viewer_payload(sources: Sequence[SampleSource], budget: int = SAMPLE_BUDGET_BYTES) -> Tuple[Dict[str, Any], List[str]]:
    """The viewer's JSON (prompts stored once, answers per view) and notes on what was left out."""
    prompts: List[str] = []
    ids: List[str] = []
    index: Dict[str, int] = {}
    out_sources, notes = [], []
    share = budget // max(1, len(sources))
    for source in sources:
        used, kept_views = 0, [[] for _ in source.views]
        cursors = [0] * len(source.views)
        total = sum(len(v.answers) for v in source.views)
        kept = 0
        progress = True
        while progress and used < share:  # one answer per view in turn, while the share lasts
            progress = False
            for vi, view in enumerate(source.views):
                if cursors[vi] >= len(view.answers) or used >= share:
                    continue
                ans = dict(view.answers[cursors[vi]])
                cursors[vi] += 1
                progress = True
                full = ans.pop("prompt")
                pid = prompt_id(full)
                prompt, _ = _clip(full)
                if pid not in index:
                    index[pid] = len(prompts)
                    prompts.append(prompt)
                    ids.append(pid)
                    used += len(prompt.encode("utf-8")) + 20
                ans["p"] = index[pid]
                ans["response"], cut = _clip(ans["response"])
                if cut:
                    ans["clipped"] = {**(ans.get("clipped") or {}), "page": cut}
                ans = {k: v for k, v in ans.items() if v is not None}
                used += len(json.dumps(ans, ensure_ascii=False).encode("utf-8"))
                kept_views[vi].append(ans)
                kept += 1
        if kept < total:
            notes.append(f"sample viewer: {source.name} shows {kept} of its {total} recorded answers "
                         f"(the page keeps about {share // 1024} KiB of answers per source)")
        out_sources.append({"name": source.name, "kind": source.kind,
                            "views": [{"label": v.label, "step": v.step, "answers": a}
                                      for v, a in zip(source.views, kept_views)]})
    return {"prompts": prompts, "prompt_ids": ids, "sources": out_sources}, notes
