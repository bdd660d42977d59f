"""Carry the plugin into every Ray worker of the job: ``ray.init`` gets the plugin's runtime env.

Host-neutral: every host whose runs start Ray (OpenRLHF, MindSpeed-RL) calls :func:`patch_ray`
with its own compatibility error; what a host wants done at ``ray.init`` (OpenRLHF: start the
driver's run record, start Ray as the CPU target runs it) it asks for with :func:`before_ray_init`, and patches of classes Ray turns
into actors with :func:`before_actor_class`.

On a cluster that ``ray.init`` starts itself, workers inherit the driver's environment, which
already holds ``RLHF_EXT_PLUGINS``. On an existing cluster (``ray.init(address=...)``, or a job
from ``ray job submit``) workers are started by the cluster's raylets, so the variables must
travel in the job's ``runtime_env``: the patched ``ray.init`` adds every ``RLHF_EXT_*`` variable
of the driver to ``runtime_env["env_vars"]`` and sets Ray's ``worker_process_setup_hook`` to
:func:`rlhf_ext.patches.activation.plugin.ray_worker_setup`. Keys the caller or the submitted job already
set are left alone (Ray refuses to merge a job's runtime env with a driver's that repeats a key).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from typing import Dict, Optional

FORWARDED_PREFIX = "RLHF_EXT_"
# Ray imports this by name in each worker (the old name, rlhf_ext.patches.plugin.ray_worker_setup,
# which jobs started by an older release still carry, forwards to it).
SETUP_HOOK = "rlhf_ext.patches.activation.plugin.ray_worker_setup"
# Set by Ray's job manager for the driver of a submitted job (ray._private.runtime_env.constants).
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def plugin_env_vars(environ=None) -> Dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIX)}


def job_runtime_env(environ=None) -> Dict:
    """The runtime env of the submitted job this driver runs in ({} outside ``ray job submit``)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(JOB_CONFIG_ENV)
    if not raw:
        return {}
    try:
        return dict(json.loads(raw).get("runtime_env") or {})
    except (ValueError, AttributeError):
        return {}


def with_plugin_runtime_env(runtime_env: Optional[Dict], environ=None) -> Dict:
    """``runtime_env`` plus the plugin's env vars and setup hook, never overriding what is set."""
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    job = job_runtime_env(environ)
    job_vars = job.get("env_vars") or {}
    for key, value in plugin_env_vars(environ).items():
        if key not in env_vars and key not in job_vars:
            env_vars[key] = value
    if env_vars:
        env["env_vars"] = env_vars
    if "worker_process_setup_hook" not in env and "worker_process_setup_hook" not in job:
        env["worker_process_setup_hook"] = SETUP_HOOK
    return env


def make_ray_init(original):
    @functools.wraps(original)
    def init(*args, **kwargs):
        kwargs["runtime_env"] = with_plugin_runtime_env(kwargs.get("runtime_env"))
        for callback in list(_before_init):
            kwargs = callback(kwargs)
        result = original(*args, **kwargs)
        for callback in list(_after_init):
            callback(kwargs)
        return result

    init.__rlhf_ext_patch__ = "ray.init runtime env"
    return init


_before_init = []
_after_init = []
_before_actor_class = []


def before_ray_init(callback) -> None:
    """Call ``callback(kwargs)`` in the patched ``ray.init``, before Ray starts; it returns the keyword
    arguments ``ray.init`` gets (the plugin's runtime env is already in them).

    Why: a host's driver may commit something only when the run really starts (OpenRLHF's run record:
    ``config.json`` is written at ``ray.init``, not at argument parsing), or start Ray as its device
    target runs it (the CPU retarget: no dashboard).
    """
    if callback not in _before_init:
        _before_init.append(callback)


def after_ray_init(callback) -> None:
    """Call ``callback(kwargs)`` in the patched ``ray.init`` once Ray is up (same keyword arguments).

    Why: on a cluster the driver joined, each node starts the job's workers with its own Python; a
    host checks there, before any model loads, that every node can run the plugin (OpenRLHF:
    :mod:`rlhf_ext.patches.openrlhf.node_check`).
    """
    if callback not in _after_init:
        _after_init.append(callback)


def before_actor_class(callback) -> None:
    """Call ``callback(cls)`` when ``ray.remote`` is about to turn class ``cls`` into an actor class.

    Why: ``@ray.remote`` (with tracing support) copies every method of the class, inherited ones
    included, into wrappers that hold the functions of that moment; a method patched on a base class
    after the decoration never runs in the actor. Patches of such bases (``BasePPOTrainer``) are
    applied here, before the decoration, in every process that imports the module.
    """
    if callback not in _before_actor_class:
        _before_actor_class.append(callback)


def make_ray_remote(original):
    @functools.wraps(original)
    def remote(*args, **kwargs):
        # `@ray.remote` on a class or function: decorate now. A RemoteFunction is callable too, so
        # only the options form (`ray.remote(num_cpus=1)`) returns a decorator to wrap.
        if len(args) == 1 and not kwargs and callable(args[0]):
            if isinstance(args[0], type):
                for callback in list(_before_actor_class):
                    callback(args[0])
            return original(*args, **kwargs)
        decorator = original(*args, **kwargs)
        if not callable(decorator):
            return decorator

        @functools.wraps(decorator)
        def decorate(target):
            if isinstance(target, type):
                for callback in list(_before_actor_class):
                    callback(target)
            return decorator(target)

        return decorate

    remote.__rlhf_ext_patch__ = "ray.remote pre-decoration hooks"
    return remote


def patch_ray(ray_module, error: type = RuntimeError) -> None:
    """Wrap ``ray.init`` (once; it must take a keyword ``runtime_env``) and ``ray.remote``.

    ``error``: the calling host's compatibility error, raised when ``ray.init`` cannot take the env.
    """
    original = ray_module.init
    if getattr(original, "__rlhf_ext_patch__", None):
        return
    try:
        params = inspect.signature(original).parameters
    except (TypeError, ValueError):
        params = {}
    if "runtime_env" not in params:
        raise error(
            f"rlhf_ext cannot pass the plugin to Ray workers: ray.init of ray {getattr(ray_module, '__version__', '?')} "
            "has no runtime_env parameter"
        )
    ray_module.init = make_ray_init(original)
    _patched.append((ray_module, "init", original))
    remote = ray_module.remote
    if not getattr(remote, "__rlhf_ext_patch__", None):
        ray_module.remote = make_ray_remote(remote)
        _patched.append((ray_module, "remote", remote))


_patched = []


def undo() -> None:
    while _patched:
        module, attr, original = _patched.pop()
        setattr(module, attr, original)
    _before_init.clear()
    _after_init.clear()
    _before_actor_class.clear()
