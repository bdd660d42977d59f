"""``data filter``: the prompts to train on next, chosen by the current model's pass rate.

Prompts the model always solves (or never solves) give GRPO-style group estimators zero
advantage and waste rollout compute (DAPO's dynamic sampling, arXiv 2503.14476, drops them
online; filtering offline between stages saves the sampling too). The output is OpenRLHF's
prompt format: ``--data.input_key`` / ``--data.label_key`` (names set by flags).
"""

from __future__ import annotations

from collections import Counter
from typing import List, Optional, Tuple

from .ranges import AccRange
from .sample_dirs import SampledRun


def filter_prompts(run: SampledRun, keep: AccRange, *, max_truncated: Optional[float] = None,
                   input_key: str = "prompt", label_key: str = "label") -> Tuple[List[dict], Counter]:
    """Rows ``{input_key: problem, label_key: gold, "id", "pass_rate"}`` of the kept prompts, and
    counts per reason (``kept``, ``dropped_acc``, ``dropped_truncated``, ``not_sampled``)."""
    if input_key == label_key:
        raise ValueError(f"--input-key and --label-key must differ, both are {input_key!r}")
    if max_truncated is not None and not 0.0 <= max_truncated <= 1.0:
        raise ValueError(f"--max-truncated is a fraction of a prompt's samples in [0, 1], got {max_truncated}")
    counts: Counter = Counter()
    rows = []
    for g in run.groups:
        if g.n == 0:
            counts["not_sampled"] += 1
        elif g.pass_rate not in keep:
            counts["dropped_acc"] += 1
        elif max_truncated is not None and g.truncated / g.n > max_truncated:
            counts["dropped_truncated"] += 1
        else:
            counts["kept"] += 1
            rows.append({input_key: g.problem, label_key: g.gold, "id": g.id, "pass_rate": round(g.pass_rate, 6)})
    return rows, counts
