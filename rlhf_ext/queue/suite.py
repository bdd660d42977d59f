"""Suite files: shared settings and an ordered list of runs, each a list of commands plus what
must exist when it is done.

A suite is TOML::

    [suite]
    name = "my_study"                       # required

    [vars]                                  # shared settings; override with --set KEY=VALUE
    model = "Qwen/Qwen2.5-Math-1.5B"
    train = ["{python}", "-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext",
             "--actor.model_name_or_path", "{model}", "--ckpt.path", "{run_dir}/ckpt"]

    [inputs]                                # data / prompt files: copied into the snapshot
    prompts = "data/gsm8k_train.jsonl"

    [defaults]                              # any run key, used where a run does not set it
    commands = [["{train}", "{algo}"]]
    expect = { checkpoint = "{run_dir}/hf/config.json" }

    [[runs]]
    name = "grpo"
    vars = { algo = ["--algo.advantage.estimator", "grpo"] }

Placeholders ``{name}`` in any string are replaced by a variable: the suite's ``[vars]``, the
run's ``vars``, ``--set`` values, ``{inputs.NAME}`` (the snapshot copy of an input) and the
built-ins ``{python}`` (the interpreter running the queue), ``{output}`` (the queue directory),
``{run}`` (the run's name), ``{run_dir}`` (``{output}/runs/{run}``), ``{suite_dir}`` and
``{snapshot}``. A command element that is exactly ``"{name}"`` of a list variable is spliced in
as several arguments. Only ``{identifier}`` and ``{a.b}`` forms are placeholders, so JSON in an
argument passes through untouched.

Run keys: ``name`` (required, unique, ``[A-Za-z0-9_.-]``), ``commands`` (list of argv lists, run
in order; one failing fails the run), ``expect`` (table ``kind = path`` or ``kind = [paths]``, or a
list of paths: what must exist when the run is done -- kinds ``record``, ``evaluation``,
``checkpoint`` name the run's final training record, evaluation and checkpoint in the manifest),
``env`` (extra environment variables), ``vars``, ``record_dir`` (optional: the run directory of
the training's run record, for the manifest; OpenRLHF with the plugin writes it to
``<--ckpt.path>/rlhf_ext_run`` unless ``--rlhf_ext.run_dir`` is given), ``seeds`` (a list of
integers: the run is expanded into one run per seed, named ``NAME_seed<S>``, in which ``{seed}`` is
that seed; the expanded runs form a seed group, the unit the report compares; ``--only NAME``
selects the whole group).
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\}")
_RUN_KEYS = {"name", "commands", "expect", "env", "vars", "record_dir", "seeds"}
_TOP_KEYS = {"suite", "vars", "inputs", "defaults", "runs"}
BUILTINS = ("python", "output", "run", "run_dir", "suite_dir", "snapshot")

VarValue = Union[str, List[str]]


class SuiteError(ValueError):
    """A suite file that cannot be run as written; the message names the file, run and key."""


@dataclass
class RunSpec:
    """One run as written in the suite (placeholders unresolved)."""

    name: str
    commands: List[List[str]]
    expect: Dict[str, List[str]]
    env: Dict[str, str] = field(default_factory=dict)
    vars: Dict[str, VarValue] = field(default_factory=dict)
    record_dir: Optional[str] = None
    group: Optional[str] = None
    """The suite's run name when this run is one seed of a ``seeds = [...]`` run (its seed group)."""


@dataclass
class ResolvedRun:
    """A run with every placeholder replaced: what the queue executes and records."""

    name: str
    commands: List[List[str]]
    expect: Dict[str, List[str]]
    env: Dict[str, str]
    run_dir: str
    record_dir: Optional[str]


@dataclass
class Suite:
    path: Path
    name: str
    vars: Dict[str, VarValue]
    inputs: Dict[str, str]
    runs: List[RunSpec]
    description: str = ""

    def run_names(self) -> List[str]:
        return [r.name for r in self.runs]

    def select(self, only: Optional[Sequence[str]]) -> List[RunSpec]:
        """The runs named in ``only`` (a seed group's name selects all its seeds), in suite order."""
        if not only:
            return list(self.runs)
        groups = {r.group for r in self.runs if r.group}
        unknown = [n for n in only if n not in self.run_names() and n not in groups]
        if unknown:
            raise SuiteError(f"{self.path}: --only names unknown run(s) {', '.join(unknown)}; "
                             f"the suite has: {', '.join(self.run_names())}"
                             + (f" (seed groups: {', '.join(sorted(groups))})" if groups else ""))
        return [r for r in self.runs if r.name in only or (r.group and r.group in only)]


def _err(path, where: str, msg: str) -> SuiteError:
    return SuiteError(f"{path}: {where}: {msg}")


def _check_var_value(path, where: str, key: str, value) -> VarValue:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise _err(path, where, f"variable {key!r} must be a string, a number or a list of strings, got {value!r}")


def _check_commands(path, where: str, value) -> List[List[str]]:
    if not isinstance(value, list) or not value:
        raise _err(path, where, "'commands' must be a non-empty list of commands (each a list of strings)")
    out = []
    for i, cmd in enumerate(value):
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, (str, int, float)) for a in cmd):
            raise _err(path, where, f"command {i + 1} must be a non-empty list of strings (an argv), got {cmd!r}")
        out.append([str(a) for a in cmd])
    return out


def _check_expect(path, where: str, value) -> Dict[str, List[str]]:
    if isinstance(value, list):
        value = {"file": value}
    if not isinstance(value, dict):
        raise _err(path, where, f"'expect' must be a table kind = path(s) or a list of paths, got {value!r}")
    out: Dict[str, List[str]] = {}
    for kind, paths in value.items():
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise _err(path, where, f"expect.{kind} must be a path or a non-empty list of paths, got {paths!r}")
        out[kind] = list(paths)
    return out


def load_suite(path: Union[str, Path]) -> Suite:
    """Parse and validate a suite file; raises :class:`SuiteError` naming what is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SuiteError(f"suite file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    return parse_suite(data, path)


def parse_suite(data: Mapping, path: Path) -> Suite:
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _err(path, "top level", f"unknown section(s) {', '.join(sorted(unknown))}; "
                                      f"expected {', '.join(sorted(_TOP_KEYS))}")
    head = data.get("suite", {})
    name = head.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _err(path, "[suite]", f"'name' must be a string of letters, digits, '_', '.', '-', got {name!r}")
    variables = {k: _check_var_value(path, "[vars]", k, v) for k, v in data.get("vars", {}).items()}
    for k in variables:
        if k in BUILTINS or k == "inputs":
            raise _err(path, "[vars]", f"{k!r} is a built-in variable and cannot be set")
    inputs = data.get("inputs", {})
    for k, v in inputs.items():
        if not isinstance(v, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise _err(path, "[inputs]", f"input {k!r} must be NAME = \"path\", got {v!r}")
    defaults = data.get("defaults", {})
    bad = set(defaults) - (_RUN_KEYS - {"name"})
    if bad:
        raise _err(path, "[defaults]", f"unknown key(s) {', '.join(sorted(bad))}")
    runs_data = data.get("runs")
    if not isinstance(runs_data, list) or not runs_data:
        raise _err(path, "top level", "a suite needs at least one [[runs]] entry")
    runs: List[RunSpec] = []
    seen = set()
    for i, raw in enumerate(runs_data):
        where = f"run {i + 1}"
        if not isinstance(raw, dict):
            raise _err(path, where, "each [[runs]] entry must be a table")
        bad = set(raw) - _RUN_KEYS
        if bad:
            raise _err(path, where, f"unknown key(s) {', '.join(sorted(bad))}; expected {', '.join(sorted(_RUN_KEYS))}")
        rname = raw.get("name")
        if not isinstance(rname, str) or not _NAME.match(rname):
            raise _err(path, where, f"'name' must be letters, digits, '_', '.', '-', got {rname!r}")
        where = f"run {rname!r}"
        if rname in seen:
            raise _err(path, where, "duplicate run name")
        seen.add(rname)
        merged = {**defaults, **raw}
        if "commands" not in merged:
            raise _err(path, where, "no 'commands' (in the run or in [defaults])")
        if "expect" not in merged:
            raise _err(path, where, "no 'expect': declare what must exist when the run is done "
                                    "(final record, evaluation, checkpoint)")
        env = merged.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise _err(path, where, "'env' must be a table of strings")
        run_vars = {**defaults.get("vars", {}), **raw.get("vars", {})}
        run_vars = {k: _check_var_value(path, where, k, v) for k, v in run_vars.items()}
        record_dir = merged.get("record_dir")
        if record_dir is not None and not isinstance(record_dir, str):
            raise _err(path, where, "'record_dir' must be a path string")
        spec = RunSpec(
            name=rname,
            commands=_check_commands(path, where, merged["commands"]),
            expect=_check_expect(path, where, merged["expect"]),
            env=dict(env),
            vars=run_vars,
            record_dir=record_dir,
        )
        if "seeds" not in merged:
            runs.append(spec)
            continue
        seeds = _check_seeds(path, where, merged["seeds"])
        if "seed" in run_vars or "seed" in variables:
            raise _err(path, where, "'seeds' sets {seed} for each expanded run; do not also set a variable 'seed'")
        if not _uses_seed(spec, variables):
            raise _err(path, where, f"seeds = {seeds} but neither its commands nor any variable uses {{seed}}: "
                                    "every seed would run the same command")
        for seed in seeds:
            member = f"{rname}_seed{seed}"
            if member in seen:
                raise _err(path, where, f"seed run {member!r} clashes with another run's name")
            seen.add(member)
            runs.append(RunSpec(name=member, commands=[list(c) for c in spec.commands],
                                expect={k: list(v) for k, v in spec.expect.items()}, env=dict(env),
                                vars={**run_vars, "seed": str(seed)}, record_dir=record_dir, group=rname))
    return Suite(path=path, name=name, vars=variables, inputs=dict(inputs), runs=runs,
                 description=str(head.get("description", "")))


def _check_seeds(path, where: str, value) -> List[int]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise _err(path, where, f"'seeds' must be a non-empty list of non-negative integers, got {value!r}")
    if len(set(value)) != len(value):
        raise _err(path, where, f"'seeds' lists a seed twice: {value!r}")
    return list(value)


def _uses_seed(spec: RunSpec, suite_vars: Mapping[str, VarValue]) -> bool:
    """Whether ``{seed}`` appears in the run's commands, env, record_dir or in any variable it could reach."""
    texts = [a for cmd in spec.commands for a in cmd] + list(spec.env.values()) + [spec.record_dir or ""]
    for value in list(spec.vars.values()) + list(suite_vars.values()):
        texts.extend(value if isinstance(value, list) else [value])
    return any("{seed}" in t for t in texts)


def parse_sets(pairs: Optional[Sequence[str]]) -> Dict[str, str]:
    """``["a=1", "b=x"]`` (from ``--set``) -> ``{"a": "1", "b": "x"}``."""
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise SuiteError(f"--set takes KEY=VALUE with KEY an identifier, got {pair!r}")
        if key in BUILTINS or key == "inputs":
            raise SuiteError(f"--set {key}: {key!r} is a built-in variable")
        out[key] = value
    return out


class _Resolver:
    def __init__(self, values: Dict[str, VarValue], where: str):
        self.values = values
        self.where = where
        self.cache: Dict[str, VarValue] = {}

    def var(self, name: str, stack=()) -> VarValue:
        if name in self.cache:
            return self.cache[name]
        if name in stack:
            raise SuiteError(f"{self.where}: variables refer to each other in a loop: {' -> '.join(stack + (name,))}")
        if name not in self.values:
            known = ", ".join(sorted(self.values))
            raise SuiteError(f"{self.where}: unknown variable {{{name}}}; known: {known}")
        raw = self.values[name]
        if isinstance(raw, list):
            value: VarValue = [a for item in raw for a in self.arg(item, stack + (name,))]
        else:
            value = self.text(raw, stack + (name,))
        self.cache[name] = value
        return value

    def text(self, s: str, stack=()) -> str:
        def sub(m):
            value = self.var(m.group(1), stack)
            if isinstance(value, list):
                raise SuiteError(f"{self.where}: list variable {{{m.group(1)}}} used inside the string {s!r}; "
                                 "a list can only stand alone as a whole command argument")
            return value

        return _PLACEHOLDER.sub(sub, s)

    def arg(self, s: str, stack=()) -> List[str]:
        m = _PLACEHOLDER.fullmatch(s)
        if m:
            value = self.var(m.group(1), stack)
            return list(value) if isinstance(value, list) else [value]
        return [self.text(s, stack)]


def resolve_path(text: str, cwd: Path) -> str:
    p = Path(text).expanduser()
    return str(p if p.is_absolute() else (cwd / p).resolve())


def resolve_inputs(suite: Suite, sets: Dict[str, str], *, output: Path, cwd: Path) -> Dict[str, str]:
    """The inputs' original paths (absolute), with suite-level variables resolved."""
    values: Dict[str, VarValue] = {**suite.vars, **sets, "python": sys.executable, "output": str(output),
                                   "suite_dir": str(suite.path.resolve().parent)}
    r = _Resolver(values, f"{suite.path}: [inputs]")
    return {k: resolve_path(r.text(v), cwd) for k, v in suite.inputs.items()}


def resolve_run(suite: Suite, run: RunSpec, sets: Dict[str, str], *, output: Path, snapshot: Path,
                inputs: Dict[str, str], python: str = sys.executable) -> ResolvedRun:
    """Replace every placeholder of ``run``; ``inputs`` maps input names to the paths commands get."""
    run_dir = output / "runs" / run.name
    values: Dict[str, VarValue] = {**suite.vars, **run.vars, **sets}
    values.update({"python": python, "output": str(output), "run": run.name, "run_dir": str(run_dir),
                   "suite_dir": str(suite.path.resolve().parent), "snapshot": str(snapshot)})
    for k, v in inputs.items():
        values[f"inputs.{k}"] = v
    r = _Resolver(values, f"{suite.path}: run {run.name!r}")
    commands = [[a for item in cmd for a in r.arg(item)] for cmd in run.commands]
    expect = {k: [r.text(p) for p in ps] for k, ps in run.expect.items()}
    env = {k: r.text(v) for k, v in run.env.items()}
    record_dir = r.text(run.record_dir) if run.record_dir else None
    return ResolvedRun(name=run.name, commands=commands, expect=expect, env=env, run_dir=str(run_dir),
                       record_dir=record_dir)


__all__ = ["ResolvedRun", "RunSpec", "Suite", "SuiteError", "load_suite", "parse_sets", "parse_suite",
           "resolve_inputs", "resolve_run"]
