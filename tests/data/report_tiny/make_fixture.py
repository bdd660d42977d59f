"""Copy real tiny-task runs into tests/data/report_tiny for the report's browser test.

Once ``--plugin rlhf_ext`` runs write run records (issue #11), make two short real runs with
different estimators and copy them here:

    python -m rlhf_ext.tours.smoke --workdir W1 --estimator grpo --eval-samples 8
    python -m rlhf_ext.tours.smoke --workdir W2 --estimator dr_grpo --eval-samples 8
    python tests/data/report_tiny/make_fixture.py W1:grpo W2:dr_grpo

Arguments are WORKDIR:NAME. From each work directory it copies the run record (the directory
whose config.json has schema ``rlhf_ext.run/1``) to ``runs/NAME`` and the evalkit directories
``eval_before`` (first WORKDIR only: every run starts from the same model) and ``eval_after`` to
``evals/base`` and ``evals/NAME_after``. Samples keep the fields evalkit's statistics read (the
response text is dropped to keep the files small). Paths are rewritten to ``/smoke/...`` (the
starting model to ``/smoke/task/model``) so the data does not depend on where it was made and
each evaluation still matches its run. tests/test_report_browser.py uses this data when
``runs/`` exists here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE_FIELDS = ("task", "problem_id", "sample_index", "correct", "extracted", "response_tokens", "truncated",
                 "gold_parsed", "grade_timeout", "grade_error")


def _rewrite_text(text: str, mapping) -> str:
    for old, new in mapping:
        text = text.replace(json.dumps(old)[1:-1], new)
    return text


def _find_record(work: Path) -> Path:
    for dirpath, _, files in os.walk(work):
        if "config.json" in files and "metrics.jsonl" in files:
            try:
                cfg = json.loads(Path(dirpath, "config.json").read_text())
            except ValueError:
                continue
            if str(cfg.get("schema", "")).startswith("rlhf_ext.run/"):
                return Path(dirpath)
    sys.exit(f"no run record (config.json with schema rlhf_ext.run/1) under {work}")


def _copy_eval(src: Path, dst: Path, mapping) -> None:
    dst.mkdir(parents=True)
    for name in ("config.json", "summary.json"):
        (dst / name).write_text(_rewrite_text((src / name).read_text(), mapping))
    with open(src / "samples.jsonl") as f, open(dst / "samples.jsonl", "w") as g:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                g.write(json.dumps({k: rec[k] for k in SAMPLE_FIELDS if k in rec}) + "\n")


def main(specs) -> None:
    for sub in ("runs", "evals"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
    for i, spec in enumerate(specs):
        work, name = spec.split(":")
        work = Path(work).resolve()
        mapping = [(str(work / "task" / "model"), "/smoke/task/model"), (str(work), f"/smoke/{name}")]
        record, out = _find_record(work), HERE / "runs" / name
        out.mkdir(parents=True)
        for f in ("config.json", "metrics.jsonl", "events.jsonl", "incident.json"):
            if (record / f).exists():
                (out / f).write_text(_rewrite_text((record / f).read_text(), mapping))
        if i == 0:
            _copy_eval(work / "eval_before", HERE / "evals" / "base", mapping)
        _copy_eval(work / "eval_after", HERE / "evals" / f"{name}_after", mapping)
    print(f"wrote {HERE / 'runs'} and {HERE / 'evals'}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or any(a.count(":") != 1 for a in sys.argv[1:]):
        sys.exit(__doc__)
    main(sys.argv[1:])
