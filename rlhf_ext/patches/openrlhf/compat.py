"""Version guard and all-or-nothing patching of OpenRLHF's seams.

Every patch names the object it replaces and the exact parameter list it was written against.
Before a module's patches are applied, all of them (and the helpers they call) are checked; a
single mismatch raises :class:`OpenRLHFCompatibilityError` naming the installed OpenRLHF version
and the patch, and nothing in that module is replaced. The driver checks every module at
start-up (:func:`verify_all`), so a mismatch stops the run before any Ray actor exists.
"""

from __future__ import annotations

import importlib
import os
import threading

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

SUPPORTED_SERIES = ((0, 11),)
SUPPORTED_DESCRIPTION = "0.11.x"
ALLOW_UNSUPPORTED_ENV = "RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF"
PATCHED_MARK = "__rlhf_ext_patch__"


class OpenRLHFCompatibilityError(RuntimeError):
    """The installed OpenRLHF does not have what an rlhf_ext patch was written against."""


_version_cache: list = []


def openrlhf_version() -> str:
    """The installed OpenRLHF's version, from its distribution metadata (read once per process)."""
    if not _version_cache:
        from importlib import metadata

        try:
            _version_cache.append(metadata.version("openrlhf"))
        except metadata.PackageNotFoundError:
            _version_cache.append("unknown (no 'openrlhf' distribution metadata)")
    return _version_cache[0]


def _series(version: str) -> Optional[Tuple[int, int]]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def check_version(version: Optional[str] = None) -> str:
    """Raise unless OpenRLHF is a supported release (``RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF=1`` overrides;
    the per-patch signature checks still run then)."""
    version = openrlhf_version() if version is None else version
    if _series(version) in SUPPORTED_SERIES:
        return version
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "") not in ("", "0"):
        return version
    raise OpenRLHFCompatibilityError(
        f"rlhf_ext supports OpenRLHF {SUPPORTED_DESCRIPTION}, but OpenRLHF {version} is installed; "
        f"install openrlhf==0.11.2, or set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway (every patch still "
        f"checks the signatures it needs)"
    )


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


def _resolve(module, path: str):
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
    # every method of an actor class, inherited ones included: Ray's, not OpenRLHF's.
    return [name for name in inspect.signature(target).parameters if name != "_ray_trace_ctx"]


def _problems(module, patch: Patch) -> List[str]:
    problems = []
    checks = [Requirement(patch.target, patch.params)] + list(patch.requires)
    for req in checks:
        try:
            _, _, obj = _resolve(module, req.path)
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


_lock = threading.RLock()
_registry: Dict[str, List[Patch]] = {}
_applied: List[Tuple[object, str, object, object]] = []  # (owner, attr, original, replacement)
_applied_modules: Dict[str, List[str]] = {}


def register(patch: Patch) -> None:
    with _lock:
        _registry.setdefault(patch.module, []).append(patch)


def patch_modules() -> List[str]:
    with _lock:
        return list(_registry)


def check_module(module) -> List[str]:
    """All problems of the patches registered for ``module`` (empty list: every check passed)."""
    with _lock:
        patches = list(_registry.get(module.__name__, []))
    problems = []
    for patch in patches:
        problems.extend(f"patch '{patch.name}': {p}" for p in _problems(module, patch))
    return problems


def apply_module(module) -> List[str]:
    """Check, then apply, every patch for ``module``; all or none. Returns the applied patch names."""
    name = module.__name__
    with _lock:
        if name in _applied_modules:
            return _applied_modules[name]
        version = openrlhf_version()
        try:
            check_version(version)
        except OpenRLHFCompatibilityError as exc:
            raise OpenRLHFCompatibilityError(f"{exc} (while patching {name})") from None
        problems = check_module(module)
        if problems:
            raise OpenRLHFCompatibilityError(
                f"rlhf_ext cannot patch OpenRLHF {version} ({name}); nothing in that module was changed:\n  "
                + "\n  ".join(problems)
            )
        done = []
        patches = list(_registry.get(name, []))
        factories = [patch.factory() for patch in patches]  # import them all before changing anything
        for patch, make in zip(patches, factories):
            owner, attr, original = _resolve(module, patch.target)
            replacement = make(original, module)
            try:
                setattr(replacement, PATCHED_MARK, patch.name)
            except (AttributeError, TypeError):
                pass
            setattr(owner, attr, replacement)
            _applied.append((owner, attr, original, replacement))
            done.append(patch.name)
        _applied_modules[name] = done
        return done


def applied() -> Dict[str, List[str]]:
    """``{module: [patch names]}`` applied in this process."""
    with _lock:
        return {k: list(v) for k, v in _applied_modules.items()}


def original(owner, attr: str):
    """The object a patch replaced at ``owner.attr`` (``KeyError`` if that seam is not patched)."""
    with _lock:
        for o, a, orig, _ in _applied:
            if o is owner and a == attr:
                return orig
    raise KeyError(f"{getattr(owner, '__name__', owner)}.{attr} is not patched")


def is_patched(obj) -> bool:
    return getattr(obj, PATCHED_MARK, None) is not None


def undo_all() -> None:
    """Restore every original (tests); the modules may be patched again afterwards."""
    with _lock:
        while _applied:
            owner, attr, original, _ = _applied.pop()
            setattr(owner, attr, original)
        _applied_modules.clear()


def verify_all() -> Dict[str, List[str]]:
    """Import every patched OpenRLHF module (which applies its patches) and report what was applied.

    Raises :class:`OpenRLHFCompatibilityError` on the first mismatch. Used by the driver before it
    parses arguments, so a broken combination stops the run at start-up.
    """
    check_version()
    for name in patch_modules():
        module = importlib.import_module(name)
        apply_module(module)  # no-op when the import hook already applied them
    return applied()
