"""Which training run a checkpoint came from, so an evaluation can be checked against its training.

OpenRLHF with ``--plugin rlhf_ext`` writes a run record (``config.json`` with the parsed flags;
docs/run_records.md) to ``<--ckpt.path>/rlhf_ext_run`` or ``--rlhf_ext.run_dir``. A checkpoint is
the run's ``--ckpt.output_dir`` (the final save), or lies under its ``--ckpt.path``
(``global_step<N>_hf``). This module looks for such a record near the evaluated model (the model's
directory, its parent and grandparent, and their subdirectories' ``rlhf_ext_run``) and reads its
``config.json`` only; run status is :mod:`rlhf_ext.runs`' business.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

RECORD_DIR = "rlhf_ext_run"


def _candidates(model: Path):
    seen = set()
    for base in (model, *list(model.parents)[:2]):
        for cand in (base / RECORD_DIR, *base.glob(f"*/{RECORD_DIR}")):
            if cand not in seen and (cand / "config.json").is_file():
                seen.add(cand)
                yield cand


def _inside(path: Path, root: Optional[str]) -> bool:
    if not root:
        return False
    try:
        path.relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def training_record_of(model) -> Optional[Tuple[Path, dict]]:
    """``(run directory, its config.json)`` of the run that wrote checkpoint ``model``, or None."""
    path = Path(model)
    if not path.is_dir():
        return None
    path = path.resolve()
    for cand in _candidates(path):
        try:
            config = json.loads((cand / "config.json").read_text())
        except (OSError, ValueError):
            continue
        args = config.get("args") or {}
        if not isinstance(args, dict):
            continue
        output = args.get("ckpt.output_dir")
        if (output and Path(output).resolve() == path) or _inside(path, args.get("ckpt.path")):
            return cand, config
    return None


def template_warning(model, generation: dict) -> Optional[str]:
    """A warning when ``model`` is a checkpoint of a recorded run whose prompt template differs from
    the evaluation's (:func:`rlhf_ext.evalkit.templates.template_mismatch`)."""
    from .templates import template_mismatch

    found = training_record_of(model)
    if found is None:
        return None
    run_dir, config = found
    message = template_mismatch(config.get("args") or {}, generation)
    return None if message is None else f"{message} (training run record: {run_dir})"
