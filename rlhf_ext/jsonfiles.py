"""JSON and JSONL files, the two rules every tool shares: replace a file atomically, read JSONL strictly.

Framework-free and imports nothing of rlhf_ext, so any layer may use it (the run records, the data
tools, evalkit, the queue, the alignment check).

* :func:`atomic_writer` / :func:`write_text_atomic` / :func:`write_json_atomic`: the new content
  goes to a temporary file beside the target, is flushed and ``fsync``'ed, then ``os.replace``
  puts it in place (atomic on POSIX: a reader sees the old file or the new one, never half of
  either); on any error the temporary file is removed and the target is left as it was.
* :func:`iter_jsonl`: the JSON object lines of an input file a person hands a tool (blank lines
  skipped); a line that is not JSON is an error naming file and line, never skipped in silence.
  Append-only logs that a killed writer may leave with a torn last line have their own tolerant
  readers (:func:`rlhf_ext.runs.read_jsonl_numbered`, :class:`rlhf_ext.evalkit.records.SampleLog`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Tuple, Type

DEFAULT_MODE = 0o644  # mkstemp's 0600 would make results unreadable to co-workers


@contextlib.contextmanager
def atomic_writer(path: os.PathLike, *, binary: bool = False, mode: int = DEFAULT_MODE,
                  sync_dir: bool = False) -> Iterator[IO]:
    """``with atomic_writer(path) as f: f.write(...)`` replaces ``path`` atomically when the block ends.

    ``mode``: the permissions of the new file. ``sync_dir``: also ``fsync`` the directory, so the
    rename itself survives a power cut (else the old file could come back).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_text_atomic(path: os.PathLike, text: str, **options: Any) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; ``options`` as :func:`atomic_writer` takes."""
    with atomic_writer(path, **options) as f:
        f.write(text)


def write_json_atomic(path: os.PathLike, obj: Any, *, indent: int = 2, ensure_ascii: bool = True,
                      allow_nan: bool = True, default=None, mode: int = DEFAULT_MODE, sync_dir: bool = False) -> None:
    """Replace ``path`` with ``obj`` as JSON (and a final newline) atomically."""
    text = json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, allow_nan=allow_nan, default=default)
    write_text_atomic(path, text + "\n", mode=mode, sync_dir=sync_dir)


def iter_jsonl(path: os.PathLike, error: Type[Exception] = ValueError,
               complaint: str = "not valid JSON") -> Iterator[Tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of ``path``, lazily (a caller may stop early).

    A line that is not valid JSON raises ``error("<path>:<line>: <complaint> (<why>)")``.
    Whether a value must be an object is the caller's rule (the data tools insist, a task file
    does not check).
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{lineno}: {complaint} ({exc.msg})") from None
            yield lineno, value
