"""The progress bar of a run (tqdm on stderr): samples done, problems done, tokens/s and the running
accuracy of this session."""

from __future__ import annotations

import sys
import time

from .generation import Generation


class Progress:
    """tqdm bar: samples done, problems done, tokens/s and running accuracy of this session."""

    def __init__(self, total: int, problems_total: int, remaining_per_problem: dict, enabled: bool):
        self.enabled = enabled and total > 0
        self.remaining = dict(remaining_per_problem)
        self.problems_total = problems_total
        self.problems_done = problems_total - sum(1 for v in self.remaining.values() if v > 0)
        self.tokens = 0
        self.correct = 0
        self.graded = 0
        self.start = time.monotonic()
        self.bar = None
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="sample", desc="evalkit", dynamic_ncols=True, file=sys.stderr)

    def generated(self, gen: Generation) -> None:
        self.tokens += gen.response_tokens

    def recorded(self, rec: dict) -> None:
        self.graded += 1
        self.correct += bool(rec["correct"])
        key = (rec["task"], rec["problem_id"])
        self.remaining[key] -= 1
        if self.remaining[key] == 0:
            self.problems_done += 1
        if self.bar is not None:
            self.bar.update(1)

    def refresh(self) -> None:
        if self.bar is None:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        acc = self.correct / self.graded if self.graded else 0.0
        self.bar.set_postfix_str(f"problems {self.problems_done}/{self.problems_total}, "
                                 f"{self.tokens / elapsed:,.0f} tok/s, acc {acc:.1%}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()
