"""``evalkit sweep RUN_DIR TASK --output DIR [evalkit options]``: every checkpoint of a run, one protocol.

Studies evaluate the starting model and every N steps on a fixed held-out set. The checkpoints of
an OpenRLHF run with ``--plugin rlhf_ext`` are listed in its run record (``events.jsonl``,
``checkpoint`` events with ``path`` and, with ``--ckpt.save_hf``, ``hf_path``; docs/run_records.md).
The sweep evaluates, in step order:

* step 0: the run's starting model (``actor.model_name_or_path`` in ``config.json``), unless
  ``--no-start``;
* every checkpoint event's Hugging Face export (``hf_path``; a DeepSpeed-only checkpoint cannot be
  loaded by vLLM and is listed as skipped, with the flag that fixes it);
* the final model (``ckpt.output_dir``) at the run's last step, when the run finished and the
  directory holds a ``config.json``.

Each evaluation is an ordinary evalkit run directory, ``DIR/step_<N>``, made by ``python -m
rlhf_ext.evalkit TASK --model M --output DIR/step_<N> [options]`` in its own process (one vLLM engine
at a time, its memory returned between checkpoints). The options are the same for every checkpoint
(stored in ``DIR/sweep.json``; a rerun with other options is refused). A checkpoint whose directory
is complete is skipped without starting anything; an interrupted one resumes (evalkit's own
resume), so rerunning the same command continues the sweep, e.g. while the training still writes
checkpoints. ``rlhf-ext report RUN_DIR --evals DIR`` places every evaluation at its step
(docs/report.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence, Tuple

from rlhf_ext import runs

from .records import CONFIG_FILE, SUMMARY_JSON, RunDirError, read_json, write_json_atomic

SWEEP_FILE = "sweep.json"


def checkpoints(run_dir, include_start: bool = True) -> Tuple[List[Tuple[int, str]], List[str]]:
    """``([(step, model path), ...] in step order, [notes about checkpoints left out])``."""
    run_dir = Path(run_dir)
    if not (run_dir / runs.CONFIG).is_file():
        raise RunDirError(f"{run_dir} is not a run record (no {runs.CONFIG})")
    config = read_json(run_dir / runs.CONFIG)
    args = config.get("args") or {}
    events = runs.read_jsonl(run_dir / runs.EVENTS)
    out: List[Tuple[int, str]] = []
    notes: List[str] = []
    start = args.get("actor.model_name_or_path")
    if include_start and start:
        out.append((0, str(start)))
    for ev in events:
        if ev.get("event") != "checkpoint" or not isinstance(ev.get("step"), int):
            continue
        hf = ev.get("hf_path")
        if hf and Path(hf).is_dir():
            out.append((ev["step"], str(hf)))
        else:
            notes.append(f"step {ev['step']}: no Hugging Face export ({hf or 'none recorded'}); train with "
                         "--ckpt.save_hf to evaluate checkpoints")
    status, _ = runs.run_status(events)
    final = args.get("ckpt.output_dir")
    metrics = runs.read_metrics(run_dir / runs.METRICS)
    if status == "finished" and final and (Path(final) / "config.json").is_file() and metrics:
        out.append((metrics[-1]["step"], str(final)))
    by_step = {}
    for step, path in out:
        by_step.setdefault(step, path)  # a checkpoint at the last step and the final save: one evaluation
    return sorted(by_step.items()), notes


def complete(out_dir: Path) -> bool:
    try:
        return read_json(out_dir / CONFIG_FILE).get("status") == "complete" and (out_dir / SUMMARY_JSON).is_file()
    except RunDirError:
        return False


def sweep(run_dir, task: str, output, options: Sequence[str] = (), include_start: bool = True,
          dry_run: bool = False, log=print) -> int:
    """Evaluate every checkpoint not evaluated yet; returns the number of failed evaluations."""
    output = Path(output)
    plan, notes = checkpoints(run_dir, include_start)
    if not plan:
        raise RunDirError(f"{run_dir}: no checkpoint to evaluate" + ("; " + "; ".join(notes) if notes else ""))
    record = {"run_dir": str(Path(run_dir).resolve()), "task": task, "options": list(options)}
    stored = output / SWEEP_FILE
    if stored.exists():
        previous = json.loads(stored.read_text())
        if previous != record:
            raise RunDirError(f"{output} holds a sweep of {previous.get('run_dir')} ({previous.get('task')}, options "
                              f"{' '.join(previous.get('options', []))}); use another --output for other options")
    for note in notes:
        log(f"evalkit sweep: skipped {note}")
    failed = 0
    for step, model in plan:
        out = output / f"step_{step}"
        if complete(out):
            log(f"evalkit sweep: step {step}: {out} complete, skipped")
            continue
        cmd = [sys.executable, "-m", "rlhf_ext.evalkit", task, "--model", model, "--output", str(out), *options]
        if (out / CONFIG_FILE).exists():
            cmd.append("--resume")
        log(f"evalkit sweep: step {step}: " + " ".join(cmd[1:]))
        if dry_run:
            continue
        output.mkdir(parents=True, exist_ok=True)
        write_json_atomic(stored, record)
        rc = subprocess.run(cmd).returncode
        if rc == 130:
            log("evalkit sweep: interrupted; rerun the same command to continue")
            return failed + 1
        if rc != 0:
            failed += 1
            log(f"evalkit sweep: step {step}: evalkit exited with {rc}")
    return failed


def add_arguments(p) -> None:
    """``evalkit sweep``'s flags; the options it does not know are evalkit's run options, passed to every
    evaluation (its row in ``rlhf_ext.evalkit.cli.SUBCOMMANDS`` holds its description)."""
    from ..ground.subcommands import forward_unknown_args

    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run record (config.json, events.jsonl)")
    p.add_argument("task", help="evalkit task (gsm8k, math500, ...) or 'run' for a custom task (--data, --name)")
    p.add_argument("--output", type=Path, required=True, help="sweep directory (one evalkit run per step)")
    p.add_argument("--no-start", action="store_true", help="do not evaluate the starting model (step 0)")
    p.add_argument("--dry-run", action="store_true", help="print the evaluations that would run")
    forward_unknown_args(p, "evalkit_options")


def run(args) -> int:
    from ..ground.subcommands import usage_error

    rest = [a for a in args.evalkit_options if a != "--"]
    for bad in ("--model", "--output", "--resume"):
        if bad in rest:
            usage_error(args, f"{bad} is set by the sweep for each checkpoint")
    failed = sweep(args.run_dir, args.task, args.output, rest, include_start=not args.no_start,
                   dry_run=args.dry_run, log=lambda m: print(m, file=sys.stderr, flush=True))
    return 1 if failed else 0
