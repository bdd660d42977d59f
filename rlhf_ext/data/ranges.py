"""``--keep "0<acc<1"``: a range of per-prompt pass rates, parsed without evaluating anything."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .io import DataToolError

_NUM = r"\s*(-?\d+(?:\.\d+)?|-?\.\d+)\s*"
_FULL = re.compile(rf"^(?:{_NUM}(<=|<))?\s*acc\s*(?:(<=|<){_NUM})?$")
_ONE_SIDED = re.compile(rf"^\s*acc\s*(>=|>|==){_NUM}$")


@dataclass(frozen=True)
class AccRange:
    """``low (<|<=) acc (<|<=) high``; ``None`` bounds are open."""

    low: Optional[float] = None
    low_inclusive: bool = True
    high: Optional[float] = None
    high_inclusive: bool = True
    text: str = "acc"

    def __contains__(self, acc: float) -> bool:
        if self.low is not None and (acc < self.low or (acc == self.low and not self.low_inclusive)):
            return False
        if self.high is not None and (acc > self.high or (acc == self.high and not self.high_inclusive)):
            return False
        return True


def parse_acc_range(text: str) -> AccRange:
    """``"0<acc<1"``, ``"0.2<=acc<=0.8"``, ``"acc<1"``, ``"acc>0"``, ``"acc>=0.5"``, ``"acc==0"``."""
    s = str(text).strip()
    m = _ONE_SIDED.match(s)
    if m:
        op, value = m.group(1), float(m.group(2))
        if op == "==":
            r = AccRange(value, True, value, True, s)
        else:
            r = AccRange(value, op == ">=", None, True, s)
    else:
        m = _FULL.match(s)
        if not m or (m.group(1) is None and m.group(3) is None):
            raise DataToolError(f"--keep {text!r}: expected a pass-rate range such as '0<acc<1', '0.2<=acc<=0.8', "
                                "'acc<1', 'acc>0' or 'acc==1'")
        low = float(m.group(1)) if m.group(1) is not None else None
        high = float(m.group(4)) if m.group(4) is not None else None
        r = AccRange(low, m.group(2) == "<=", high, m.group(3) == "<=", s)
    for bound in (r.low, r.high):
        if bound is not None and not 0.0 <= bound <= 1.0:
            raise DataToolError(f"--keep {text!r}: pass-rate bounds must lie in [0, 1], got {bound}")
    if r.low is not None and r.high is not None and (r.low > r.high or (r.low == r.high and not (
            r.low_inclusive and r.high_inclusive))):
        raise DataToolError(f"--keep {text!r}: the range is empty")
    return r
