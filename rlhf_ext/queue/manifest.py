"""``manifest.json``: the queue's state, rewritten atomically after every change.

A reader (``rlhf-ext queue status``, a rerun of the queue, another tool) always sees either the
previous manifest or the new one, never a torn file: each write goes to a temporary file in the
same directory, is flushed and fsync'ed, and replaces the manifest with ``os.replace`` (atomic on
POSIX), after which the directory entry is fsync'ed too. A runner killed mid-write leaves at most
a stray ``.manifest.json.*.tmp`` file, which the next write ignores and :func:`load` never reads.

Run statuses: ``pending`` -> ``running`` -> ``done`` | ``failed`` | ``interrupted``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..ground.jsonfiles import write_json_atomic

SCHEMA = "rlhf_ext.queue/1"
MANIFEST = "manifest.json"
PENDING, RUNNING, DONE, FAILED, INTERRUPTED = "pending", "running", "done", "failed", "interrupted"
STATUSES = (PENDING, RUNNING, DONE, FAILED, INTERRUPTED)


class ManifestError(ValueError):
    pass


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that readers see the old or the new file, never a mix.

    The directory is ``fsync``'ed too: the rename itself must reach the disk, or a power cut could
    bring the old manifest back. (Owner-only permissions, as the queue has always written it.)
    """
    write_json_atomic(path, data, indent=1, mode=0o600, sync_dir=True)


def load(output: Path) -> Dict[str, Any]:
    path = Path(output) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{output} is not a queue directory (no {MANIFEST})") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); it was not written by rlhf-ext queue") from None
    if data.get("schema") != SCHEMA:
        raise ManifestError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data


def new_run_entry(name: str, *, commands: List[List[str]], expect: Dict[str, List[str]], run_dir: str,
                  record_dir: Optional[str], sha256: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "name": name,
        "status": PENDING,
        "reason": None,
        "failure": None,  # "guard" when the non-finite guard stopped the run (its record says so)
        "attempt": 0,
        "commands": commands,
        "command_index": None,
        "pid": None,
        "pgid": None,
        "ray_submission_id": None,
        "started_at": None,
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "logs": [],
        "run_dir": run_dir,
        "record_dir": record_dir,
        "expect": expect,
        "missing": [],
        "paths": {"record": expect.get("record", []), "evaluation": expect.get("evaluation", []),
                  "checkpoint": expect.get("checkpoint", [])},
        "sha256": sha256,
        "previous_attempts": [],
    }


class Manifest:
    """The in-memory manifest of one queue directory; :meth:`save` writes it atomically."""

    def __init__(self, output: Path, data: Dict[str, Any]):
        self.output = Path(output)
        self.data = data

    @classmethod
    def create(cls, output: Path, **fields) -> "Manifest":
        data = {"schema": SCHEMA, "created_at": time.time(), "updated_at": None, "status": "new",
                "runner": None, "runs": []}
        data.update(fields)
        return cls(output, data)

    @classmethod
    def open(cls, output: Path) -> "Manifest":
        return cls(output, load(output))

    @property
    def runs(self) -> List[Dict[str, Any]]:
        return self.data["runs"]

    def run(self, name: str) -> Dict[str, Any]:
        for r in self.runs:
            if r["name"] == name:
                return r
        raise KeyError(name)

    def save(self) -> None:
        self.data["updated_at"] = time.time()
        atomic_write_json(self.output / MANIFEST, self.data)


__all__ = ["DONE", "FAILED", "INTERRUPTED", "MANIFEST", "PENDING", "RUNNING", "SCHEMA", "STATUSES", "Manifest",
           "ManifestError", "atomic_write_json", "load", "new_run_entry"]
