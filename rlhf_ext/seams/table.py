"""Patches at a host's seams: each names its target and the parameter list it was written for, and a
module's patches are applied all or none.

Every host's glue describes its patches with :class:`Patch` (and the other objects a replacement
relies on with :class:`Requirement`) and keeps a :class:`PatchRegistry` of its own in its
``compat`` module, so two hosts never patch or undo each other's modules. Before a module's patches
are applied, all of them are checked (:func:`requirement_problems`); a single mismatch raises the
host's compatibility error naming the installed version and the patch, and nothing in that module
is replaced. The seam tables themselves stay in each host's ``__init__.py``.

Framework-free and light: imported at interpreter start-up by plugin activation.
"""

from __future__ import annotations

import importlib
import os
import threading

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

PATCHED_MARK = "__rlhf_ext_patch__"


def release_series(version: str) -> Optional[Tuple[int, int]]:
    """``"0.11.2"`` -> ``(0, 11)``; None when the version does not start with two numbers."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def version_allowed(version: str, supported_series: Iterable[Tuple[int, int]], allow_env: str) -> bool:
    """Whether ``version`` is in a supported release series, or the ``allow_env`` variable overrides."""
    return release_series(version) in tuple(supported_series) or os.environ.get(allow_env, "") not in ("", "0")


class Requirement:
    """An object a patch relies on: ``path`` inside the module ("Class.method" or "name") and the
    parameter names it must have (``None``: existence only)."""

    __slots__ = ("path", "params")

    def __init__(self, path: str, params: Optional[Sequence[str]] = None):
        self.path = path
        self.params = None if params is None else tuple(params)


class Patch:
    """Replace ``module.<target>`` with ``make(original, module)``.

    ``params`` is the target's exact parameter list; ``requires`` lists the other objects the
    replacement relies on. ``make`` may be a ``"package.module:function"`` string, imported only
    when the patch is applied.
    """

    __slots__ = ("name", "module", "target", "params", "make", "requires")

    def __init__(
        self,
        name: str,
        module: str,
        target: str,
        params: Optional[Sequence[str]],
        make: Union[str, Callable[[object, object], object]],
        requires: Sequence[Requirement] = (),
    ):
        self.name, self.module, self.target, self.make = name, module, target, make
        self.params = None if params is None else tuple(params)
        self.requires = tuple(requires)

    def __repr__(self) -> str:
        return f"Patch({self.name!r}, {self.module}.{self.target})"

    def factory(self) -> Callable[[object, object], object]:
        if callable(self.make):
            return self.make
        module_name, _, attr = self.make.partition(":")
        return getattr(importlib.import_module(module_name), attr)


def resolve(module, path: str):
    """``(owner, attribute name, object)`` of ``path`` inside ``module``; ``AttributeError`` if absent."""
    owner, attr = module, path
    if "." in path:
        owner_path, attr = path.rsplit(".", 1)
        for part in owner_path.split("."):
            owner = getattr(owner, part)
    if isinstance(owner, type):
        # Look in the class dict so a method is replaced on the class that defines it.
        for klass in owner.__mro__:
            if attr in vars(klass):
                return owner, attr, vars(klass)[attr]
        raise AttributeError(attr)
    return owner, attr, getattr(owner, attr)


def _param_names(obj) -> List[str]:
    import inspect

    target = obj.__init__ if isinstance(obj, type) else obj
    # ``@ray.remote`` (tracing support) adds a keyword-only ``_ray_trace_ctx`` to the signature of
    # every method of an actor class, inherited ones included: Ray's, not the host's.
    return [name for name in inspect.signature(target).parameters if name != "_ray_trace_ctx"]


def requirement_problems(module, requirements: Iterable[Requirement]) -> List[str]:
    """Each requirement ``module`` does not meet: a missing object, or other parameters (empty: all fit)."""
    problems = []
    for req in requirements:
        try:
            _, _, obj = resolve(module, req.path)
        except AttributeError:
            problems.append(f"{module.__name__}.{req.path} does not exist")
            continue
        if req.params is None:
            continue
        try:
            got = _param_names(obj)
        except (TypeError, ValueError) as exc:
            problems.append(f"cannot read the signature of {module.__name__}.{req.path}: {exc}")
            continue
        if got != list(req.params):
            problems.append(
                f"{module.__name__}.{req.path} has parameters ({', '.join(got)}), expected ({', '.join(req.params)})"
            )
    return problems


def patch_problems(module, patch: Patch) -> List[str]:
    """What keeps ``patch`` from fitting ``module``: its target's and its requirements' problems."""
    return requirement_problems(module, [Requirement(patch.target, patch.params)] + list(patch.requires))


def is_patched(obj) -> bool:
    return getattr(obj, PATCHED_MARK, None) is not None


class PatchRegistry:
    """One host's patches by module, what of them is applied in this process, and how to undo it.

    ``host`` names the framework in messages ("OpenRLHF"); ``check_version()`` returns the
    installed version or raises ``error``, the host's compatibility error.
    """

    def __init__(self, host: str, check_version: Callable[[], str], error: type):
        self.host, self._check_version, self.error = host, check_version, error
        self._lock = threading.RLock()
        self._registry: Dict[str, List[Patch]] = {}
        self._applied: List[Tuple[object, str, object, object]] = []  # (owner, attr, original, replacement)
        self._applied_modules: Dict[str, List[str]] = {}

    def register(self, patch: Patch) -> None:
        with self._lock:
            self._registry.setdefault(patch.module, []).append(patch)

    def patch_modules(self) -> List[str]:
        with self._lock:
            return list(self._registry)

    def check_module(self, module) -> List[str]:
        """All problems of the patches registered for ``module`` (empty list: every check passed)."""
        with self._lock:
            patches = list(self._registry.get(module.__name__, []))
        problems = []
        for patch in patches:
            problems.extend(f"patch '{patch.name}': {p}" for p in patch_problems(module, patch))
        return problems

    def apply_module(self, module) -> List[str]:
        """Check, then apply, every patch for ``module``; all or none. Returns the applied patch names."""
        name = module.__name__
        with self._lock:
            if name in self._applied_modules:
                return self._applied_modules[name]
            try:
                version = self._check_version()
            except self.error as exc:
                raise self.error(f"{exc} (while patching {name})") from None
            problems = self.check_module(module)
            if problems:
                raise self.error(
                    f"rlhf_ext cannot patch {self.host} {version} ({name}); nothing in that module was changed:\n  "
                    + "\n  ".join(problems)
                )
            done = []
            patches = list(self._registry.get(name, []))
            factories = [patch.factory() for patch in patches]  # import them all before changing anything
            for patch, make in zip(patches, factories):
                owner, attr, original = resolve(module, patch.target)
                replacement = make(original, module)
                try:
                    setattr(replacement, PATCHED_MARK, patch.name)
                except (AttributeError, TypeError):
                    pass
                setattr(owner, attr, replacement)
                self._applied.append((owner, attr, original, replacement))
                done.append(patch.name)
            self._applied_modules[name] = done
            return done

    def record(self, owner, attr: str, original, replacement) -> None:
        """Note a replacement made outside :meth:`apply_module`, so :meth:`undo_all` restores it too."""
        with self._lock:
            self._applied.append((owner, attr, original, replacement))

    def applied(self) -> Dict[str, List[str]]:
        """``{module: [patch names]}`` applied in this process."""
        with self._lock:
            return {k: list(v) for k, v in self._applied_modules.items()}

    def original(self, owner, attr: str):
        """The object a patch replaced at ``owner.attr`` (``KeyError`` if that seam is not patched)."""
        with self._lock:
            for o, a, orig, _ in self._applied:
                if o is owner and a == attr:
                    return orig
        raise KeyError(f"{getattr(owner, '__name__', owner)}.{attr} is not patched")

    def undo_all(self) -> None:
        """Restore every original (tests); the modules may be patched again afterwards."""
        with self._lock:
            while self._applied:
                owner, attr, original, _ = self._applied.pop()
                setattr(owner, attr, original)
            self._applied_modules.clear()

    def verify_all(self) -> Dict[str, List[str]]:
        """Import every patched module (which applies its patches) and report what was applied.

        Raises the host's error on the first mismatch. Used by the driver before it parses
        arguments, so a broken combination stops the run at start-up.
        """
        self._check_version()
        for name in self.patch_modules():
            self.apply_module(importlib.import_module(name))  # no-op when the import hook already applied them
        return self.applied()


__all__ = [
    "PATCHED_MARK",
    "Patch",
    "PatchRegistry",
    "Requirement",
    "is_patched",
    "patch_problems",
    "release_series",
    "requirement_problems",
    "resolve",
    "version_allowed",
]
