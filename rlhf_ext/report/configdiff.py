"""What differs between runs' configurations, and a one-line description of each run's algorithm.

The comparable view of a run's ``config.json`` is its parsed arguments (``args``, by their dotted
OpenRLHF names), the plugin settings (``plugin.*``), package versions (``versions.*``), the git
commit and dirty flag, and the content hashes of its data files (paths do not matter, contents
do). Output locations (checkpoint paths, the run directory, run names) always differ between
runs and say nothing about them, so they are left out of the diff and counted instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .loaded_runs import flatten

ABSENT = object()
"""Marks a key one run lacks (shown as a dash), distinct from a recorded ``null``."""

_OUTPUT_LOCATION = re.compile(
    r"(^|\.)(output_dir|save_path|run_dir|run_name|wandb_run_name|wandb_project|wandb_group|"
    r"tensorboard_dir|use_tensorboard|log_dir|logging_path)$|^ckpt\.(path|output_dir|save_path|load_path)$")


def is_output_location(key: str) -> bool:
    """Keys naming where a run writes (they always differ between runs)."""
    return bool(_OUTPUT_LOCATION.search(key))


def comparable_view(config: dict) -> Dict[str, object]:
    """The flat ``key -> value`` view of a run record's config that :func:`diff_configs` compares."""
    view: Dict[str, object] = {}
    view.update(flatten(config.get("args") or {}))
    for section in ("plugin", "versions"):
        view.update(flatten(config.get(section) or {}, section + "."))
    git = config.get("git") or {}
    for key in ("commit", "dirty"):
        if key in git:
            view[f"git.{key}"] = git[key]
    hashes = config.get("data_sha256") or {}
    if hashes:
        view["data (sha256)"] = ", ".join(sorted(str(h)[:12] for h in hashes.values()))
    return view


@dataclass
class ConfigDiff:
    keys: List[str]
    """Keys whose values differ between at least two runs, sorted."""
    values: Dict[str, List[object]]
    """key -> one value per run (:data:`ABSENT` where a run lacks it)."""
    same: int
    """Keys present in every run with one value."""
    output_locations: int
    """Output-location keys left out (see :func:`is_output_location`)."""


def diff_configs(configs: Sequence[dict]) -> ConfigDiff:
    """Keys whose values differ between runs (a key missing in some runs differs too)."""
    views = [comparable_view(c) for c in configs]
    all_keys = sorted(set().union(*views)) if views else []
    keys, values, same, hidden = [], {}, 0, 0
    for key in all_keys:
        row = [v.get(key, ABSENT) for v in views]
        if len({canonical(x) for x in row}) <= 1:
            same += 1
            continue
        if is_output_location(key):
            hidden += 1
            continue
        keys.append(key)
        values[key] = row
    return ConfigDiff(keys=keys, values=values, same=same, output_locations=hidden)


def canonical(value) -> str:
    if value is ABSENT:
        return "\0absent"
    if isinstance(value, float) and value == int(value) and abs(value) < 2**53:
        value = int(value)  # 1 and 1.0 are the same setting
    return json.dumps(value, sort_keys=True, default=str)


def format_value(value, limit: int = 60) -> str:
    if value is ABSENT:
        return "\u2014"
    if isinstance(value, str):
        text = value
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _get(args: Dict[str, object], *keys: str) -> Optional[object]:
    for key in keys:
        if key in args and args[key] is not None:
            return args[key]
    return None


def algorithm_summary(args: Dict[str, object]) -> Dict[str, str]:
    """Estimator, loss type, aggregation mode, KL settings and clip range of a run, as short strings."""
    out = {
        "estimator": format_value(_get(args, "algo.advantage.estimator") or "?"),
        "policy loss": format_value(_get(args, "actor.policy_loss_type") or "ppo"),
        "aggregation": format_value(_get(args, "actor.loss_agg_mode") or "?"),
    }
    kl_coef = _get(args, "algo.kl.init_coef")
    kl_parts = []
    if kl_coef is not None:
        kl_parts.append(f"coef {format_value(kl_coef)}")
    estimator = _get(args, "algo.kl.estimator")
    if estimator is not None:
        kl_parts.append(str(estimator))
    use_loss = _get(args, "algo.kl.use_loss")
    if use_loss is not None:
        kl_parts.append("in loss" if use_loss else "in reward")
    if "algo.kl.clip" in args:
        clip = args["algo.kl.clip"]
        kl_parts.append("no clamp" if clip is None else f"clamp {format_value(clip)}")
    if isinstance(kl_coef, (int, float)) and not isinstance(kl_coef, bool) and kl_coef == 0:
        kl_parts = ["off (coef 0)"]
    out["KL"] = ", ".join(kl_parts) if kl_parts else "?"
    clip = _get(args, "actor.eps_clip_low_high", "actor.eps_clip")
    if clip is not None:
        out["clip"] = format_value(clip)
    return out
