"""``rollout_samples.jsonl``: a bounded sample of each step's training rollouts (docs/run_records.md).

Which rollouts (:func:`select_rollout_samples`: whole prompt groups, in an order fixed by the prompt
text), one line each (:func:`rollout_sample_record`), reading them back (:func:`read_rollout_samples`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .files import as_number, read_jsonl_numbered

SAMPLES_PER_STEP = 8
"""Default cap of recorded rollouts per step (``--rlhf_ext.rollout_samples``; 0 turns the file off)."""
SAMPLES_TOTAL = 2000
"""Default cap of recorded rollouts over the whole run (``--rlhf_ext.rollout_samples_total``)."""
SAMPLE_TEXT_CHARS = 4000
"""Longest prompt / response text kept per recorded rollout (characters; the rest is counted, not kept)."""


def prompt_id(prompt: str) -> str:
    """A short, stable name of a prompt text (first 12 hex digits of its SHA-1): the key that finds
    the same prompt at two steps, in the run record and in the report's sample viewer."""
    import hashlib

    return hashlib.sha1(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def select_rollout_samples(prompts: Sequence[str], cap: int) -> List[int]:
    """Which of a step's rollouts to record: indices into ``prompts`` (one entry per rollout), at most ``cap``.

    Whole prompt groups first (every answer to a prompt, so a group's spread is visible), the
    groups in the order of :func:`prompt_id`. The order depends on the prompt text alone, so a prompt
    recorded at one step is recorded again whenever it comes back (the next epoch): the viewer
    can show the same prompt at two steps without keeping every rollout.
    """
    if cap <= 0:
        return []
    groups: Dict[str, List[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt_id(str(prompt)), []).append(i)
    chosen: List[int] = []
    for pid in sorted(groups):
        chosen.extend(groups[pid][: cap - len(chosen)])
        if len(chosen) >= cap:
            break
    return chosen


def _clip(text: Any, limit: int) -> Tuple[str, int]:
    text = "" if text is None else str(text)
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def rollout_sample_record(step: int, *, prompt: str, response: str, reward: Optional[float],
                          components: Optional[Mapping[str, Any]] = None, advantage: Optional[float] = None,
                          truncated: Optional[bool] = None, response_tokens: Optional[int] = None,
                          label: Any = None, turns: Optional[Sequence[Mapping[str, Any]]] = None,
                          text_chars: int = SAMPLE_TEXT_CHARS) -> Dict[str, Any]:
    """One ``rollout_samples.jsonl`` line (docs/run_records.md). Texts longer than ``text_chars`` are
    cut, the number of characters left out is under ``clipped``; non-finite numbers become ``null``.
    ``turns`` (multi-turn agents): the segments after the prompt, ``{"role": "assistant" |
    "environment", "text", "tokens"}`` in order; each text is cut at ``text_chars`` too."""

    def num(value):
        ok, number = as_number(value)
        return number if ok and number is not None and math.isfinite(number) else None

    prompt_text, prompt_cut = _clip(prompt, text_chars)
    response_text, response_cut = _clip(response, text_chars)
    rec: Dict[str, Any] = {"step": int(step), "prompt_id": prompt_id(str(prompt)), "prompt": prompt_text,
                           "response": response_text, "reward": num(reward),
                           "components": {str(k): num(v) for k, v in (components or {}).items()},
                           "advantage": num(advantage),
                           "truncated": None if truncated is None else bool(truncated),
                           "response_tokens": None if response_tokens is None else int(response_tokens)}
    if label is not None:
        # choice / ranking golds are objects: kept as their JSON text
        rec["label"] = label if isinstance(label, (str, int, float, bool)) else json.dumps(label, default=str)
    if prompt_cut or response_cut:
        rec["clipped"] = {k: n for k, n in (("prompt", prompt_cut), ("response", response_cut)) if n}
    if turns:
        rec["turns"] = []
        for turn in turns:
            text, cut = _clip(turn.get("text"), text_chars)
            entry = {"role": str(turn.get("role")), "text": text, "tokens": num(turn.get("tokens"))}
            if cut:
                entry["clipped"] = cut
            rec["turns"].append(entry)
    return rec


def read_rollout_samples(path: os.PathLike, warnings: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The lines of a ``rollout_samples.jsonl`` that carry a step, a prompt and a response, in file order."""
    out = []
    for lineno, rec in read_jsonl_numbered(path, warnings):
        if isinstance(rec.get("step"), int) and isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
            out.append(rec)
        elif warnings is not None:
            warnings.append(f"{Path(path).name} line {lineno} is not a rollout sample (step, prompt, response); skipped")
    return out
