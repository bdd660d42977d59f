"""Find run records and evalkit directories under a work directory (used by the smoke run to
write its report at the end)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import List, Optional, Tuple

from .loaded_runs import CONFIG_FILE, SCHEMA_PREFIX


def _config(path: Path) -> Optional[dict]:
    try:
        obj = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def find_records(root, max_depth: int = 4) -> Tuple[List[Path], List[Path]]:
    """(run record directories, evalkit output directories) under ``root``, sorted, at most
    ``max_depth`` levels down; model checkpoints and their config.json are not mistaken for either."""
    root = Path(root)
    runs, evals = [], []
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        if len(Path(dirpath).relative_to(root).parts) >= max_depth:
            dirnames[:] = []
        if CONFIG_FILE not in files:
            continue
        cfg = _config(Path(dirpath))
        if cfg is None:
            continue
        if str(cfg.get("schema", "")).startswith(SCHEMA_PREFIX):
            runs.append(Path(dirpath))
            dirnames[:] = []
        elif "suite" in cfg and "generation" in cfg and "samples.jsonl" in files:
            evals.append(Path(dirpath))
            dirnames[:] = []
    return sorted(runs), sorted(evals)


def report_workdir(work, output=None) -> Tuple[Optional[Path], str]:
    """Write ``work/report.html`` from the run records and evaluations under ``work``.

    Returns ``(path, message)``; ``path`` is None (and the message says why) when there is no
    run record to report on, or plotly is not installed.
    """
    from .page import write_report

    work = Path(work)
    runs, evals = find_records(work)
    if not runs:
        return None, (f"no run record under {work} (runs write one with --plugin rlhf_ext; docs/report.md); "
                      "no report written")
    output = Path(output) if output else work / "report.html"
    command = ["rlhf-ext", "report", *map(str, runs), *(["--evals", *map(str, evals)] if evals else []), "-o", str(output)]
    try:
        write_report(runs, output, eval_dirs=evals, quiet=True, command=shlex.join(command))
    except ImportError as exc:
        return None, f"no report written: {exc} (pip install 'rlhf_ext[report]')"
    return output, f"{len(runs)} run(s), {len(evals)} evaluation(s)"
