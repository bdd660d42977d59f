"""``rlhf-ext queue``: run a suite of training runs one after another, safely, with a manifest.

A suite file (:mod:`.suite`) lists runs, each a list of commands plus what must exist when it is
done. :func:`run_queue` (:mod:`.runner`) takes a snapshot of code, suite and inputs
(:mod:`.snapshot`), then runs one run at a time under a lock (:mod:`.lock`), recording everything
in an atomically rewritten ``manifest.json`` (:mod:`.manifest`); :func:`status` and :func:`stop`
(:mod:`.control`) read and signal it. The rules are in docs/queue.md.
"""

from .control import report, status, stop
from .lock import QueueLock, QueueLockedError, read_holder
from .manifest import (DONE, FAILED, INTERRUPTED, MANIFEST, PENDING, RUNNING, Manifest, ManifestError,
                       atomic_write_json)
from .runner import EXIT_INTERRUPTED, QueueError, dry_run, run_queue
from .snapshot import sha256_tree, take_snapshot, verify_code
from .suite import ResolvedRun, RunSpec, Suite, SuiteError, load_suite, parse_sets, resolve_run

__all__ = [
    "report",
    "DONE", "EXIT_INTERRUPTED", "FAILED", "INTERRUPTED", "MANIFEST", "PENDING", "RUNNING",
    "Manifest", "ManifestError", "QueueError", "QueueLock", "QueueLockedError", "ResolvedRun", "RunSpec", "Suite",
    "SuiteError", "atomic_write_json", "dry_run", "load_suite", "parse_sets", "read_holder", "resolve_run",
    "run_queue", "sha256_tree", "status", "stop", "take_snapshot", "verify_code",
]  # fmt: skip
