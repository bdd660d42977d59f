"""Supervising a training command: stop at the first dead actor, say why, and leave nothing running.

A Ray job whose rollout engine (or policy, or reference model) died at start can sit idle for a
long time: the surviving actors wait in a collective for a peer that no longer exists. The driver
prints Ray's verdict ("The actor died ...", ``ActorDiedError``) and the dead actor's traceback long
before that, so :class:`DeathWatch` reads the console as it streams and calls the run dead at the
first such line (after a short grace period, so the actor's own error lines arrive too), and
:func:`failure_cause` picks out the lines a user needs to read.

Ray starts its processes (GCS, raylet, workers) as children of the driver, some in sessions of
their own, so killing the driver's process group is not enough: :class:`ProcessTree` remembers
every descendant it has seen while the run lived and kills them all at the end. A process killed
while it JIT-built a C++ op leaves that build's lock behind, which would hang every later run on
the machine: :func:`remove_stale_build_locks` clears what the stopped run left.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

DEATH_PATTERNS = (
    re.compile(r"The actor died"),
    re.compile(r"\bActorDiedError\b"),
    re.compile(r"\bActorUnavailableError\b"),
    re.compile(r"Exception raised in creation task"),
    re.compile(r"\bWeightSyncRendezvousError\b"),
)
"""Console lines that mean a process of the run is gone for good."""

_ERROR_LINE = re.compile(r"\b(?:\w+\.)*(\w*(?:Error|Exception))\b: \S")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's "(Actor pid=N)" and vLLM's "(EngineCore pid=N)" prefixes (nested), then a log record's header.
_PREFIXES = re.compile(r"^(?:\s*\([\w-]+ pid=\d+(?:, ip=[\d.]+)?\)\s*)+"
                       r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")
DEATH_GRACE_S = 15.0
"""Seconds to keep reading after the first death line, so the dead actor's own error lines arrive."""


class DeathWatch:
    """Feed it console lines; :attr:`dead` turns true once a death line was seen and the grace passed."""

    def __init__(self, grace: float = DEATH_GRACE_S, clock=time.monotonic):
        self.grace = grace
        self._clock = clock
        self.first_line: Optional[str] = None
        self._seen_at: Optional[float] = None

    def feed(self, line: str) -> None:
        if self._seen_at is None and any(p.search(line) for p in DEATH_PATTERNS):
            self.first_line = line.rstrip("\n")
            self._seen_at = self._clock()

    @property
    def seen(self) -> bool:
        return self._seen_at is not None

    @property
    def dead(self) -> bool:
        return self._seen_at is not None and self._clock() - self._seen_at >= self.grace


def failure_cause(text: str, limit: int = 8) -> List[str]:
    """The distinct error lines of a failed run's console, root cause last.

    Ray repeats an actor's error in every caller's traceback; each message is kept once. Ray's
    verdicts ("The actor died ...") come first, then the specific errors, latest first, so the
    earliest one -- the root cause -- is the last line. Lines are stripped of Ray's ``(Actor pid=N)``
    prefix.
    """
    ordered: Dict[str, None] = {}
    for line in text.splitlines():
        body = _PREFIXES.sub("", _ANSI.sub("", line)).strip()
        if body.startswith("rlhf_ext: "):  # the supervisor's own notes about the run
            continue
        if body and (_ERROR_LINE.search(body) or _is_verdict(body)):
            ordered.setdefault(body, None)
    verdicts = [line for line in ordered if _is_verdict(line)]
    # Later specific errors are mostly consequences of the first one: it goes last, where the eye lands.
    specific = [line for line in ordered if not _is_verdict(line)][::-1]
    return (verdicts + specific)[-limit:]


def _is_verdict(line: str) -> bool:
    return any(p.search(line) for p in DEATH_PATTERNS)


class ProcessTree:
    """Every descendant of a process seen while it ran (pid, start time), to kill them all at the end."""

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.known: Dict[int, float] = {}

    def snapshot(self) -> None:
        import psutil

        try:
            children = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                self.known.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass

    def alive(self) -> List[int]:
        """Known descendants still running (a reused pid with another start time is not ours)."""
        import psutil

        pids = []
        for pid, started in self.known.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - started) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE:
                    pids.append(pid)
            except psutil.Error:
                pass
        return pids

    def kill_all(self, grace: float = 10.0) -> Tuple[int, int]:
        """SIGTERM every living known descendant, SIGKILL what is left after ``grace`` s; (termed, killed)."""
        self.snapshot()
        pids = self.alive()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.2)
        left = self.alive()
        for pid in left:
            _signal(pid, signal.SIGKILL)
        return len(pids), len(left)


def torch_extensions_root(env: Optional[Dict[str, str]] = None) -> Path:
    """Where torch (and DeepSpeed through it) JIT-builds C++ ops for processes with environment ``env``
    (``torch/utils/cpp_extension.py``)."""
    env = os.environ if env is None else env
    return Path(env.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")


def remove_stale_build_locks(since: float, root: Optional[Path] = None) -> List[Path]:
    """Delete JIT-build ``lock`` files created at or after ``since`` (a Unix time); returns them.

    torch serialises builds of one op with a ``lock`` file that only its holder removes. A run
    stopped while one of its processes was building (DeepSpeed builds its CPU ops on first use)
    leaves that file behind, and every later run on the machine then waits for it forever
    (``FileBaton.wait``). Call this only once every process of the run is dead: a lock it created
    then has no holder left. (A build of some other job on the same machine that started during
    the run would lose its lock too; runs of one machine are assumed not to overlap.)
    """
    root = torch_extensions_root() if root is None else root
    removed = []
    for lock in root.glob("*/*/lock"):
        try:
            if lock.stat().st_mtime >= since - 1:
                lock.unlink()
                removed.append(lock)
        except FileNotFoundError:
            pass
    return removed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = ["DEATH_GRACE_S", "DEATH_PATTERNS", "DeathWatch", "ProcessTree", "failure_cause", "remove_stale_build_locks",
           "torch_extensions_root"]
