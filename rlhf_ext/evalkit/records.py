"""Run directory storage: crash-safe ``samples.jsonl`` appends, atomic JSON files, resume bookkeeping.

``samples.jsonl`` is append-only. Each batch of finished samples is encoded first and written
with a single ``write`` on an ``O_APPEND`` descriptor, so a crash (or Ctrl-C) can at worst cut the
last line short. Readers skip such a torn tail, and :meth:`SampleLog.repair` truncates it before
the next append, so the file always parses and a sample is recorded exactly once.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Iterable, Optional

from ..ground import jsonfiles

SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

SampleKey = tuple[str, str, int]  # (task, problem id, sample index)


class RunDirError(ValueError):
    """A run directory is missing, malformed, or incompatible with the requested run."""


def sample_key(record: dict) -> SampleKey:
    return (str(record["task"]), str(record["problem_id"]), int(record["sample_index"]))


class SampleLog:
    """The ``samples.jsonl`` of one run directory."""

    def __init__(self, path, fsync_interval: float = 2.0):
        self.path = Path(path)
        self.fsync_interval = fsync_interval
        self._fd: Optional[int] = None
        self._last_sync = 0.0

    def read(self) -> list[dict]:
        """All complete records in file order, first occurrence of each key only.

        A final line without its newline is a write cut short by a crash: it is ignored (and
        :meth:`repair` removes it). A malformed line anywhere else is corruption and raises.
        """
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete, _, _ = data.rpartition(b"\n")
        records: list[dict] = []
        seen: set[SampleKey] = set()
        duplicates = 0
        for lineno, line in enumerate(complete.split(b"\n") if complete else [], 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = sample_key(record)
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
                raise RunDirError(f"{self.path}:{lineno}: corrupt sample record ({exc}); "
                                  "move the file away or fix that line") from exc
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            records.append(record)
        if duplicates:
            warnings.warn(f"{self.path}: {duplicates} duplicate sample records ignored (first kept)")
        return records

    def torn_bytes(self) -> int:
        """Length of an unterminated last line (0 if the file ends cleanly)."""
        return jsonfiles.torn_tail_bytes(self.path)

    def repair(self) -> int:
        """Truncate a torn last line; return the number of bytes removed."""
        return jsonfiles.drop_torn_tail(self.path, fsync=True)

    def append(self, records: Iterable[dict]) -> int:
        """Append records, one line each, in a single write; return how many were written."""
        lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records]
        if not lines:
            return 0
        if self._fd is None:
            self.repair()
            self._fd = jsonfiles.open_append(self.path)
        jsonfiles.write_all(self._fd, "".join(lines).encode("utf-8"))
        now = time.monotonic()
        if now - self._last_sync >= self.fsync_interval:
            os.fsync(self._fd)
            self._last_sync = now
        return len(lines)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "SampleLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_json_atomic(path, obj) -> None:
    """Write JSON through a temporary file and ``os.replace`` so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonfiles.write_json_atomic(path, obj, indent=2, ensure_ascii=False)


def write_text_atomic(path, text: str) -> None:
    jsonfiles.write_text_atomic(path, text)


def read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RunDirError(f"{path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc.msg})") from exc


def generation_mismatch(stored: dict, requested: dict) -> list[str]:
    """Human-readable differences between two runs' generation parameters (empty when compatible)."""
    diffs = []
    for key in sorted(set(stored) | set(requested)):
        a, b = stored.get(key), requested.get(key)
        if a != b:
            diffs.append(f"{key}: run has {json.dumps(a)[:120]}, requested {json.dumps(b)[:120]}")
    return diffs
