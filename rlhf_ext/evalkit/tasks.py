"""Benchmark registry and loaders: which problems a task has, where they come from, what the gold is.

Each task loads from the Hugging Face Hub by default (ids below) or from a local JSONL file given
with ``--data``. Field names differ between copies of the same benchmark (``problem`` vs
``question``, GSM8K's ``#### 72`` answers, AMC's ``27.0``), so each task lists the fields it
accepts and how its gold answer is normalised. A dataset's identity is the SHA-256 of its
normalised problems, recorded in every run so that runs over different copies never mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence
from urllib.parse import urlparse

from ..ground.jsonfiles import iter_jsonl


class DataError(ValueError):
    """A benchmark could not be loaded, or its file is malformed."""


@dataclass(frozen=True)
class Problem:
    """One problem. For a choice/ranking task (``answer_type``) ``text`` is the question followed by
    its options (``A. ...`` lines), ``gold`` the JSON of its structured gold
    (:func:`rlhf_ext.rewards.choice.parse_structured_gold` reads it; so does the reward of a training
    job that gets it as its label), ``question`` the question alone (to show the options in another
    order) and ``pair_id`` the id it shares with its flipped twin."""

    task: str
    id: str
    text: str
    gold: str
    answer_type: str = "math"
    question: Optional[str] = None
    pair_id: Optional[str] = None


def _plain(value) -> str:
    return str(value).strip()


def _gsm8k_gold(value) -> str:
    # GSM8K answers are worked solutions ending in "#### 1,234"; the number after #### is the gold.
    text = str(value)
    if "####" not in text:
        return text.strip().replace(",", "")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _number_gold(value) -> str:
    # AMC copies store answers as floats ("27.0"); an integral float is written as the integer.
    if isinstance(value, bool):
        raise DataError(f"answer {value!r} is not a number")
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    if re.fullmatch(r"-?\d+\.0+", text):
        return text.split(".")[0]
    return text


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    hub_id: str
    hub_split: str
    hub_config: Optional[str]
    size: int
    answer_format: str
    local_names: tuple[str, ...]
    text_fields: tuple[str, ...] = ("problem", "question", "Problem")
    answer_fields: tuple[str, ...] = ("answer", "Answer")
    id_fields: tuple[str, ...] = ("id", "unique_id", "idx", "ID")
    gold: Callable[[object], str] = field(default=_plain)
    require_id: bool = False  # an explicit --id-key: a row without it is an error, not "use the position"
    answer_type: str = "math"  # "choice" / "ranking": rows hold "options" and a label (or ordered labels)


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("aime24", "AIME 2024 (I and II)", "HuggingFaceH4/aime_2024", "train", None, 30,
         "integer 0-999", ("aime24.jsonl", "aime_2024.jsonl")),
    Task("aime25", "AIME 2025 (I and II)", "yentinglin/aime_2025", "train", None, 30,
         "integer 0-999", ("aime25.jsonl", "aime_2025.jsonl"), gold=_number_gold),
    Task("math500", "MATH-500 (Lightman et al. 2023 split of MATH)", "HuggingFaceH4/MATH-500", "test", None,
         500, "LaTeX expression", ("math500.jsonl", "math500_test.jsonl", "MATH-500.jsonl")),
    Task("gsm8k", "GSM8K test", "openai/gsm8k", "test", "main", 1319,
         "integer (after '####' in the solution)", ("gsm8k_test.jsonl", "gsm8k.jsonl"), gold=_gsm8k_gold),
    Task("amc23", "AMC 2023 (12A and 12B)", "math-ai/amc23", "test", None, 40,
         "number ('27.0' read as 27)", ("amc23.jsonl",), gold=_number_gold),
)}

# A suite is what the command line names; ``aime`` runs both years, reported separately and combined.
SUITES: dict[str, tuple[str, ...]] = {"aime": ("aime24", "aime25"), **{name: (name,) for name in TASKS}}


@dataclass(frozen=True)
class TaskData:
    task: str
    problems: tuple[Problem, ...]
    source: str  # "hub:<id>[/<config>]:<split>" or an absolute file path
    sha256: str  # of the full normalised dataset, before --limit


def suite_tasks(suite: str) -> tuple[str, ...]:
    if suite not in SUITES:
        raise DataError(f"unknown task {suite!r}; choose from {', '.join(SUITES)}")
    return SUITES[suite]


def dataset_sha256(problems: Sequence[Problem]) -> str:
    # a pair id joins the identity only where there is one, so math datasets keep their hashes
    payload = json.dumps([[p.id, p.text, p.gold] + ([p.pair_id] if p.pair_id is not None else []) for p in problems],
                         ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def rows_to_problems(task: Task, rows: Sequence[dict], origin: str) -> tuple[Problem, ...]:
    """Normalise raw rows (any accepted field names) into problems; reject ambiguous data."""
    if not rows:
        raise DataError(f"{origin}: no rows for task {task.name}")
    problems = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        where = f"{origin}: row {i + 1}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        text = next((row[f] for f in task.text_fields if row.get(f) not in (None, "")), None)
        if text is None:
            raise DataError(f"{where}: no problem text (expected one of the fields {', '.join(task.text_fields)})")
        answer = next((row[f] for f in task.answer_fields if row.get(f) not in (None, "")), None)
        if answer is None:
            raise DataError(f"{where}: no answer (expected one of the fields {', '.join(task.answer_fields)})")
        raw_id = next((row[f] for f in task.id_fields if row.get(f) not in (None, "")), None)
        if raw_id is None and task.require_id:
            raise DataError(f"{where}: no id (expected the field {task.id_fields[0]!r})")
        pid = str(raw_id) if raw_id is not None else str(i)
        if pid in seen:
            raise DataError(f"{where}: duplicate problem id {pid!r} (also row {seen[pid] + 1}); "
                            "ids must be unique for per-problem statistics and resume")
        seen[pid] = i
        if task.answer_type != "math":
            problems.append(_structured_problem(task, row, pid, str(text), answer, where))
            continue
        try:
            gold = task.gold(answer)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: bad answer {answer!r}: {exc}") from exc
        if not gold:
            raise DataError(f"{where}: empty gold answer")
        problems.append(Problem(task=task.name, id=pid, text=str(text), gold=gold))
    return tuple(problems)


def _structured_problem(task: Task, row: dict, pid: str, question: str, answer, where: str) -> Problem:
    """A choice/ranking row: ``options`` (list or {label: text}) and ``answer`` (a label, or the labels
    in order), an optional ``pair_id``; the problem text shows the options after the question."""
    from rlhf_ext.rewards.choice import GoldFormatError, parse_structured_gold, render_options

    if "options" not in row and task.answer_type != "ranking":
        raise DataError(f"{where}: a {task.answer_type} task needs an 'options' field (a list, or an object "
                        "of label: text)")
    spec = {"answer_type": task.answer_type, "answer": answer}
    if "options" in row:
        spec["options"] = row["options"]
    try:
        # a ranking without 'options' orders every option: its answer's labels are the options
        gold = parse_structured_gold(spec)
    except GoldFormatError as exc:
        raise DataError(f"{where}: {exc}") from exc
    pair = row.get("pair_id")
    text = render_options(question, gold.options) if "options" in row else question
    return Problem(task=task.name, id=pid, text=text,
                   gold=json.dumps(gold.as_label(), ensure_ascii=False, separators=(",", ":")),
                   answer_type=task.answer_type, question=question, pair_id=None if pair is None else str(pair))


def read_jsonl(path: Path) -> list[dict]:
    return [row for _, row in iter_jsonl(path, DataError)]


def resolve_data_paths(tasks: Sequence[str], data: Sequence[str]) -> dict[str, Path]:
    """Map each task to a local file from ``--data`` arguments.

    Accepted forms: ``FILE.jsonl`` (only when one task runs), ``TASK=FILE.jsonl``, or a directory
    holding the task's usual file name (``aime24.jsonl``, ``math500.jsonl``, ``gsm8k_test.jsonl``...).
    """
    mapping: dict[str, Path] = {}
    for item in data:
        name, sep, rest = item.partition("=")
        if sep and name in TASKS:
            if name not in tasks:
                raise DataError(f"--data {item}: task {name} is not part of this run ({', '.join(tasks)})")
            mapping[name] = _existing_file(Path(rest), item)
            continue
        path = Path(item)
        if path.is_dir():
            for task in tasks:
                if task in mapping:
                    continue
                for candidate in TASKS[task].local_names:
                    if (path / candidate).is_file():
                        mapping[task] = (path / candidate).resolve()
                        break
            continue
        if len(tasks) != 1:
            raise DataError(f"--data {item}: this run has several tasks ({', '.join(tasks)}); "
                            "name each file as TASK=FILE or pass a directory holding "
                            + ", ".join(TASKS[t].local_names[0] for t in tasks))
        mapping[tasks[0]] = _existing_file(path, item)
    missing = [t for t in tasks if t not in mapping]
    if data and missing:
        raise DataError("--data gives no file for " + ", ".join(
            f"{t} (looked for {' or '.join(TASKS[t].local_names)})" for t in missing))
    return mapping


def _existing_file(path: Path, arg: str) -> Path:
    if not path.is_file():
        raise DataError(f"--data {arg}: no such file {path}")
    return path.resolve()


def load_task(name: str, data_path: Optional[Path] = None, *, limit: Optional[int] = None,
              task: Optional[Task] = None) -> TaskData:
    """Load one task from ``data_path`` or, without one, from the Hugging Face Hub.

    ``task``: a task built by :func:`custom_task` instead of a registered one (needs ``data_path``).
    """
    if task is None:
        if name not in TASKS:
            raise DataError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
        task = TASKS[name]
    elif data_path is None:
        raise DataError(f"task {task.name!r} is not a built-in benchmark: it needs a --data FILE")
    if limit is not None and limit < 1:
        raise DataError(f"--limit must be >= 1, got {limit}")
    if data_path is not None:
        rows = read_jsonl(Path(data_path))
        source = os.fspath(Path(data_path).resolve())
    else:
        rows, source = _load_from_hub(task)
    problems = rows_to_problems(task, rows, source)
    sha = dataset_sha256(problems)
    if limit is not None:
        problems = problems[:limit]
    return TaskData(task=name, problems=problems, source=source, sha256=sha)


_CUSTOM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def custom_task(name: str, problem_key: Optional[str] = None, answer_key: Optional[str] = None,
                id_key: Optional[str] = None, answer_type: str = "math") -> Task:
    """A task over any JSONL of problems with gold answers (``evalkit run --data FILE --name NAME``).

    Without explicit keys the fields the built-in tasks accept are tried (``problem`` / ``question``,
    ``answer``, ``id`` / ``unique_id``...); without an id field a row's position is its id. Gold
    answers are read as the AMC loader reads them (an integral float ``27.0`` is ``27``).
    """
    if not isinstance(name, str) or not _CUSTOM_NAME.fullmatch(name):
        raise DataError(f"--name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
    if name in SUITES:
        raise DataError(f"--name {name!r} is a built-in task; run 'evalkit {name} --data FILE' for it, or choose "
                        "another name for a custom task")
    for flag, key in (("--problem-key", problem_key), ("--answer-key", answer_key), ("--id-key", id_key)):
        if key is not None and not key.strip():
            raise DataError(f"{flag} must be a non-empty field name")
    if answer_type not in ("math", "choice", "ranking"):
        raise DataError(f"--answer-type must be math, choice or ranking, got {answer_type!r}")
    defaults = Task(name, "", "", "", None, 0, "", ())
    return Task(name=name, title=f"custom task {name}", hub_id="", hub_split="", hub_config=None, size=0,
                answer_format="as in the file", local_names=(),
                text_fields=(problem_key,) if problem_key else defaults.text_fields,
                answer_fields=(answer_key,) if answer_key else defaults.answer_fields,
                id_fields=(id_key,) if id_key else defaults.id_fields,
                gold=_number_gold, require_id=id_key is not None, answer_type=answer_type)


def _hub_reachable(timeout: float = 5.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _load_from_hub(task: Task) -> tuple[list[dict], str]:
    source = f"hub:{task.hub_id}" + (f"/{task.hub_config}" if task.hub_config else "") + f":{task.hub_split}"
    hint = (f"download it and pass --data FILE.jsonl (one JSON object per line with fields "
            f"{task.text_fields[0]!r} and {task.answer_fields[0]!r}), or --data DIR holding "
            f"{task.local_names[0]}")
    # datasets retries an unreachable hub for ~30 s per file; probe once, and if the hub is down
    # fall back to the local cache only (offline mode), which answers at once.
    if os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false", "False") and not _hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets  # lazy: heavy, and unnecessary with --data
    except ImportError as exc:
        raise DataError(f"{task.name}: loading from the Hugging Face Hub needs the 'datasets' package "
                        f"({exc}); install it, or {hint}") from exc
    try:
        ds = datasets.load_dataset(task.hub_id, task.hub_config, split=task.hub_split)
    except Exception as exc:  # datasets raises many unrelated types for "not reachable / not cached"
        raise DataError(f"{task.name}: could not load {task.hub_id} from the Hugging Face Hub "
                        f"({type(exc).__name__}: {str(exc)[:200]}); without hub access it must be in the "
                        f"local datasets cache. Alternatively {hint}") from exc
    return [dict(row) for row in ds], source
