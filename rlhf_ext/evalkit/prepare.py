"""A run made ready before any engine starts: its data loaded, its generation parameters (what shapes
a sample, recorded in ``config.json``) and its run directory (by default named after them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from .options import RunOptions
from .tasks import DataError, TaskData, load_task, resolve_data_paths, suite_tasks
from .templates import check_template_text


@dataclass
class PreparedRun:
    options: RunOptions
    tasks: list[TaskData]
    generation: dict
    output: Path
    # (task, problem id) -> (prompt text, token ids); rendered on demand, see render_prompts()
    prompts: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = field(default_factory=dict)


def model_fingerprint(model: str) -> str:
    """Cheap identity of a checkpoint: its config and the names and sizes of its files.

    Hashing gigabytes of weights per run would cost minutes; a retrained checkpoint written to
    the same path changes sizes or config in practice. Hub ids are their own identity.
    """
    path = Path(model)
    if not path.is_dir():
        return f"id:{model}"
    h = hashlib.sha256()
    for child in sorted(path.iterdir()):
        if child.is_file():
            h.update(f"{child.name}\0{child.stat().st_size}\0".encode())
            if child.suffix in (".json", ".jinja", ".txt", ".model") and child.stat().st_size < 50_000_000:
                h.update(child.read_bytes())
    return "sha256:" + h.hexdigest()


def default_output_dir(options: RunOptions, generation: dict) -> Path:
    """``evalkit_runs/<model name>/<suite>-<hash of generation parameters>``: rerunning the same
    command lands in the same directory (and resumes); changing a parameter starts a new one."""
    digest = hashlib.sha256(repr(sorted(generation.items())).encode()).hexdigest()[:10]
    name = Path(options.model.rstrip("/")).name or "model"
    return Path("evalkit_runs") / name / f"{options.suite}-{digest}"


def prepare(options: RunOptions) -> PreparedRun:
    """Load data and work out the run directory and its generation parameters; no engine yet."""
    options.validate()
    custom = options.task_definition()
    if custom is not None:
        path = Path(options.data[0])
        if not path.is_file():
            raise DataError(f"--data {path}: no such file")
        task_data = [load_task(custom.name, path.resolve(), limit=options.limit, task=custom)]
    else:
        tasks = suite_tasks(options.suite)
        paths = resolve_data_paths(tasks, list(options.data)) if options.data else {}
        task_data = [load_task(t, paths.get(t), limit=options.limit) for t in tasks]
    # A local checkpoint is identified by its absolute path, so reruns from another directory match.
    model = str(Path(options.model).resolve()) if Path(options.model).is_dir() else options.model
    generation = {
        "model": model,
        "model_fingerprint": model_fingerprint(options.model),
        "template": options.template,
        "system_prompt": options.system_prompt,
        "temperature": options.temperature,
        "top_p": options.top_p,
        "max_tokens": options.max_tokens,
        "seed": options.seed,
        "datasets": {td.task: td.sha256 for td in task_data},
    }
    if options.template == "file":
        generation["template_text"] = check_template_text(options.template_text)
    # Recorded when set; absent means off, so runs made before these options keep their parameters
    # (and their default output directory) unchanged.
    if options.top_k != -1:
        generation["top_k"] = options.top_k
    if options.min_p != 0:
        generation["min_p"] = options.min_p
    if custom is not None:
        # Which fields were read is part of what a sample means: another key is another task.
        generation["custom_task"] = {k: v for k, v in options.custom_task.items()
                                     if k != "answer_type" or v not in (None, "math")}
    if options.shuffle_options is not None:
        generation["shuffle_options"] = options.shuffle_options
    output = Path(options.output) if options.output else default_output_dir(options, generation)
    return PreparedRun(options=options, tasks=task_data, generation=generation, output=output)
