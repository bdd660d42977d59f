"""What derives from a sample's identity (seed, task, problem id, sample index), never from its
position: its sampling seed and, with ``--shuffle-options``, the order its options are shown in. So
``--limit``, data-parallel sharding and resume never change what a sample is."""

from __future__ import annotations

import hashlib


def problem_seed(seed: int, task: str, problem_id: str) -> int:
    """Seed of sample 0 of a problem; sample i uses ``problem_seed + i`` (vLLM's n-sample rule).

    Derived from the problem's identity, not its position, so --limit, sharding and resume never
    change which sample a seed produces. Kept below 2**30 so ``+ i`` stays a small positive int.
    """
    digest = hashlib.sha256(f"{seed}\0{task}\0{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x3FFFFFFF


def option_permutation(seed: int, task: str, problem_id: str, sample_index: int, n: int) -> list[int]:
    """The order in which sample ``sample_index`` of a problem shows its ``n`` options (``--shuffle-options``):
    shown option i is original option ``perm[i]``. Derived from the problem's identity like its seed."""
    import random

    digest = hashlib.sha256(f"shuffle\0{seed}\0{task}\0{problem_id}\0{sample_index}".encode()).digest()
    perm = list(range(n))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(perm)
    return perm
