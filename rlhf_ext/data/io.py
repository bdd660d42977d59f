"""JSONL in and out for the data tools: every command refuses to overwrite what it would write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List

from ..ground.jsonfiles import atomic_writer, iter_jsonl


class DataToolError(ValueError):
    """Bad input or an output that must not be overwritten; the message names the problem."""


def read_jsonl(path) -> List[dict]:
    """Rows of a JSONL file (blank lines skipped); a bad line is an error naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataToolError(f"{path}: no such file")
    rows = []
    for lineno, row in iter_jsonl(path, DataToolError):
        if not isinstance(row, dict):
            raise DataToolError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def check_output(path, force: bool = False) -> Path:
    """Refuse an existing output file unless ``force``; create its directory."""
    path = Path(path)
    if path.exists() and not force:
        raise DataToolError(f"{path} exists; refusing to overwrite it (choose another --output, or --force)")
    if path.is_dir():
        raise DataToolError(f"{path} is a directory; --output must be a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_jsonl(path, rows: Iterable[dict], force: bool = False) -> int:
    """Write ``rows`` atomically (temporary file, then rename); returns the number written."""
    path = check_output(path, force)
    n = 0
    with atomic_writer(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n
