"""The lock that keeps a second runner off a queue directory.

``DIR/queue.lock`` is held with ``fcntl.flock`` for the runner's whole life and holds the
runner's pid. The kernel drops the lock when the runner exits, however it exits (even
``kill -9``), so a stale lock file never blocks a rerun; the pid in it is only informative.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Optional

LOCK = "queue.lock"


class QueueLockedError(RuntimeError):
    pass


class QueueLock:
    def __init__(self, output: Path):
        self.path = Path(output) / LOCK
        self._fd: Optional[int] = None

    def acquire(self) -> "QueueLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_holder(self.path.parent)
            raise QueueLockedError(
                f"another queue runner{f' (pid {holder})' if holder else ''} is using {self.path.parent}; "
                f"stop it with 'rlhf-ext queue stop {self.path.parent}' or wait for it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def read_holder(output: Path) -> Optional[int]:
    """The pid of the runner holding the lock of ``output``, or None when no runner holds it."""
    path = Path(output) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


__all__ = ["LOCK", "QueueLock", "QueueLockedError", "read_holder"]
