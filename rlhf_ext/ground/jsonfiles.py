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
* :func:`append_bytes` / :func:`open_append` + :func:`write_all`, :func:`torn_tail_bytes`,
  :func:`drop_torn_tail`: the torn-line-safe append of those logs. Every batch of whole lines goes
  out in one ``write`` on an ``O_APPEND`` descriptor (no interleaving with other appenders; a crash
  leaves at most one torn last line), and a writer that reopens a log drops such a torn tail first.
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


# --- append-only JSONL logs: torn-line-safe appends --------------------------------------------


def open_append(path: os.PathLike) -> int:
    """An ``O_APPEND`` descriptor of ``path`` (created with :data:`DEFAULT_MODE`): every ``write`` on
    it lands whole at the end of the file, never interleaved with another appender's."""
    return os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, DEFAULT_MODE)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked: signals, huge payloads)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def append_bytes(path: os.PathLike, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path`` with a single write on an ``O_APPEND`` descriptor."""
    fd = open_append(path)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def torn_tail_bytes(path: os.PathLike) -> int:
    """Length of an unterminated last line of ``path`` (0 if the file ends cleanly, is empty or is missing)."""
    path = Path(path)
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb") as f:
        # scan back in blocks for the last newline; lines can be long (full responses)
        pos, block = size, 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return size - (start + idx + 1)
            pos = start
    return size


def drop_torn_tail(path: os.PathLike, *, fsync: bool = False) -> int:
    """Truncate a torn (unterminated) last line left by a killed writer; the number of bytes removed.
    ``fsync``: make the truncation durable before returning."""
    path = Path(path)
    torn = torn_tail_bytes(path)
    if torn:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - torn)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return torn
