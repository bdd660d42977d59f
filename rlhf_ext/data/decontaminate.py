"""Benchmark decontamination by word n-gram overlap.

A training problem is contaminated when it shares a word n-gram (after :func:`normalize`) with a
benchmark problem -- the rule of GPT-3's 13-gram filter (Brown et al. 2020, appendix C) at the
shorter n that math decontamination scripts use (Open-R1 ``scripts/decontaminate.py``: 8). A
problem shorter than n words matches only a benchmark problem with the same normalised text.
Benchmarks: the files evalkit knows (AIME 24/25, MATH-500, GSM8K test, AMC 23; ``--benchmarks
DIR`` holding their usual file names) and any ``--against FILE`` JSONL of problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from rlhf_ext.evalkit.tasks import TASKS, load_task

from .io import DataToolError, read_jsonl
from .rules import word_ngrams


TEXT_FIELDS = ("problem", "question", "prompt", "Problem")


@dataclass(frozen=True)
class BenchmarkItem:
    benchmark: str
    id: str
    text: str


def load_benchmarks(dirs: Sequence[Path] = (), files: Sequence[Path] = ()) -> List[BenchmarkItem]:
    items: List[BenchmarkItem] = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise DataToolError(f"--benchmarks {d}: not a directory")
        found = 0
        for task in TASKS.values():
            path = next((d / n for n in task.local_names if (d / n).is_file()), None)
            if path is not None:
                found += 1
                items += [BenchmarkItem(task.name, p.id, p.text) for p in load_task(task.name, path).problems]
        if not found:
            raise DataToolError(f"--benchmarks {d}: holds none of evalkit's benchmark files "
                                f"({', '.join(t.local_names[0] for t in TASKS.values())})")
    for f in files:
        f = Path(f)
        if not f.is_file():
            raise DataToolError(f"--against {f}: no such file")
        # Only the problem text matters here: answers may be absent.
        for i, row in enumerate(read_jsonl(f)):
            text = next((row[k] for k in TEXT_FIELDS if row.get(k) not in (None, "")), None)
            if text is None:
                raise DataToolError(f"--against {f}: line {i + 1} has no problem text "
                                    f"(fields {', '.join(TEXT_FIELDS)})")
            pid = next((row[k] for k in ("id", "unique_id", "idx", "ID") if row.get(k) not in (None, "")), i + 1)
            items.append(BenchmarkItem(f.name, str(pid), str(text)))
    return items


class NgramIndex:
    """n-gram -> the benchmark items containing it."""

    def __init__(self, items: Sequence[BenchmarkItem], n: int = 8):
        if n < 1:
            raise DataToolError(f"--ngram must be >= 1, got {n}")
        self.n = n
        self.index: Dict[str, List[BenchmarkItem]] = {}
        for item in items:
            for gram in word_ngrams(item.text, n):
                self.index.setdefault(gram, []).append(item)

    def match(self, text: str) -> Optional[Tuple[BenchmarkItem, str]]:
        """The first benchmark item sharing an n-gram with ``text``, and that n-gram."""
        for gram in sorted(word_ngrams(text, self.n)):
            hits = self.index.get(gram)
            if hits:
                return hits[0], gram
        return None
