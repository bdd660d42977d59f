"""``--train.agent_func_path FILE``: an agent file that fails ends the run with one line naming it.

OpenRLHF 0.11.2 loads the file in every rollout actor (``vllm_engine._load_agent_executor``, in
``RolloutRayActor.__init__``) and calls its ``AgentExecutor.execute`` for every sample. Left alone,
a file that raises at import kills the rollout actors during the cluster's start-up (minutes in),
and one that raises in ``AgentInstance.step`` surfaces as a Ray traceback through three actors
whose last line is the bare exception, without the file. Two places make that one line:

* the driver, right after parsing (:func:`finalize`, called by the plugin's flag parser): the file
  is loaded the way OpenRLHF loads it and its ``AgentExecutor`` is built once, so a missing file,
  an exception at import, a missing ``AgentExecutor`` or one that does not derive from
  OpenRLHF's ``AgentExecutorBase`` is an argparse error before Ray starts. Loading it runs the
  user's own file in the driver, as OpenRLHF runs it in each rollout actor;
* the rollout actors (seam ``vllm_engine._load_agent_executor``): a failure at import there (a file
  that differs on that node) becomes :class:`AgentFileError`, and the executor's ``execute`` is
  wrapped so that an exception raised by code of the agent file, or by OpenRLHF's executor on
  what the file's ``step`` returned, becomes :class:`AgentFileError` naming the file, the function,
  the line and the exception. The run then ends as any failed Ray task does: the driver's
  ``ray.get`` raises (in async mode ``PPOTrainerAsync.fit``'s ``ray.get`` returns at the first
  failed actor), the driver exits and its local Ray cluster goes with it.
"""

from __future__ import annotations

import functools
import os
import traceback
from typing import Optional

AGENT_FLAG = "--train.agent_func_path"
_OPENRLHF_AGENT_MODULE = os.path.join("openrlhf", "utils", "agent.py")


class AgentFileError(RuntimeError):
    """The agent file of ``--train.agent_func_path`` failed; the message names the file and the cause."""


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _where(exc: BaseException, path: str) -> Optional[str]:
    """``"step() at line 12: <source>"`` for the innermost frame of ``exc`` in the file ``path``."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if _same_file(frame.filename, path):
            found = frame
    if found is None:
        return None
    code = f": {found.line.strip()}" if found.line else ""
    return f"{found.name}() at line {found.lineno}{code}"


def _in_openrlhf_executor(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.endswith(_OPENRLHF_AGENT_MODULE)


def describe(path: str, stage: str, exc: BaseException) -> str:
    """One line: the file, what was being done, where in the file, the exception."""
    where = _where(exc, path)
    return (f"{AGENT_FLAG} {path}: {stage} raised {type(exc).__name__}: {exc}"
            + (f" (in {where})" if where else ""))


def load_agent_executor(path: str):
    """Load ``path`` as OpenRLHF 0.11.2's ``_load_agent_executor`` does and build its ``AgentExecutor``;
    raises ``ValueError`` with one line naming the file and the cause."""
    import importlib.util

    if not str(path).endswith(".py"):
        raise ValueError(f"{AGENT_FLAG} {path}: OpenRLHF loads a Python file (*.py)")
    if not os.path.isfile(path):
        raise ValueError(f"{AGENT_FLAG} {path}: no such file")
    from openrlhf.utils.agent import AgentExecutorBase

    spec = importlib.util.spec_from_file_location("agent_module", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise ValueError(describe(path, "importing it", exc)) from None
    cls = getattr(module, "AgentExecutor", None)
    if cls is None:
        raise ValueError(f"{AGENT_FLAG} {path}: the file defines no AgentExecutor (a subclass of OpenRLHF's "
                         "MultiTurnAgentExecutor or AgentExecutorBase, see docs/openrlhf_plugin.md)")
    if not (isinstance(cls, type) and issubclass(cls, AgentExecutorBase)):
        raise ValueError(f"{AGENT_FLAG} {path}: AgentExecutor must derive from openrlhf.utils.agent.AgentExecutorBase "
                         "(usually MultiTurnAgentExecutor)")
    try:
        return cls()
    except (Exception, SystemExit) as exc:
        raise ValueError(describe(path, "AgentExecutor()", exc)) from None


def finalize(namespace) -> None:
    """Driver: check ``--train.agent_func_path`` before Ray starts (``ValueError`` -> argparse error)."""
    path = getattr(namespace, "train.agent_func_path", None)
    if path:
        load_agent_executor(path)
        # the rollout actors load it by this path; Ray workers do not share the driver's working directory
        setattr(namespace, "train.agent_func_path", os.path.abspath(path))


def guard_execute(executor, path: str):
    """Wrap ``executor.execute`` so the agent file's failures become :class:`AgentFileError` (in place)."""
    execute = executor.execute

    @functools.wraps(execute)
    async def guarded(*args, **kwargs):
        try:
            return await execute(*args, **kwargs)
        except Exception as exc:
            if _where(exc, path) is not None:
                message = describe(path, "the agent", exc)
            elif _in_openrlhf_executor(exc):
                message = (f"{AGENT_FLAG} {path}: OpenRLHF's executor could not use what the agent returned: "
                           f"{type(exc).__name__}: {exc} (step() returns rewards and scores as tensors, "
                           "environment_feedback, done, and optionally extra_logs, sampling_params)")
            else:
                raise
            # the cause's traceback is summarised in the message: the driver's last line is this one
            raise AgentFileError(message) from None

    executor.execute = guarded
    return executor


def make_load_agent_executor(original, module=None):
    """``vllm_engine._load_agent_executor`` (rollout actors): clear errors at import and in ``step``."""

    @functools.wraps(original)
    def _load_agent_executor(agent_func_path):
        try:
            executor = original(agent_func_path)
        except Exception as exc:
            raise AgentFileError(describe(agent_func_path, "loading it in a rollout actor", exc)) from None
        return guard_execute(executor, agent_func_path)

    return _load_agent_executor


__all__ = ["AGENT_FLAG", "AgentFileError", "describe", "finalize", "guard_execute", "load_agent_executor",
           "make_load_agent_executor"]
