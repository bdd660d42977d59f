"""One host's release rule (which versions the glue was written for) and its patch registry's functions.

Every host package (``patches/openrlhf``, ``patches/mindspeed_rl``, ``patches/verl``) states its
supported release series, the variable that overrides the refusal and its compatibility error in
a :class:`HostRelease`; the version is read once per process and the refusal names the installed
version, what is supported and how to try anyway. A host that keeps a
:class:`~rlhf_ext.seams.table.PatchRegistry` (:meth:`HostRelease.patch_registry`) hands its
functions out at module level with :func:`registry_functions` (``compat.register(...)``,
``from .compat import apply_module``).

Framework-free and light: imported at interpreter start-up by plugin activation.
"""

from __future__ import annotations

from .table import PatchRegistry, version_allowed

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~15 ms at start-up
if TYPE_CHECKING:
    from typing import Callable, Iterable, Optional, Tuple


def distribution_version(*names: str) -> Optional[str]:
    """The version in the first of the distributions ``names`` that is installed (None: none is)."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


class HostRelease:
    """The releases of ``host`` this glue supports, and the check that refuses the others.

    ``read_version()`` returns the installed version or None (default: the distribution metadata
    of ``distribution``). ``install_hint`` is the advice given before the override
    (``"install openrlhf==0.11.2"``); ``still_checked`` says what still guards an overridden run.
    """

    def __init__(
        self,
        host: str,
        supported_series: Iterable[Tuple[int, int]],
        supported_description: str,
        allow_env: str,
        error: type,
        *,
        distribution: Optional[str] = None,
        read_version: Optional[Callable[[], Optional[str]]] = None,
        missing: Optional[str] = None,
        install_hint: str = "",
        in_use: str = "installed",
        still_checked: str = "every patch still checks the signatures it needs",
    ):
        if read_version is None and distribution is None:
            raise ValueError(f"HostRelease({host!r}) needs a distribution name or a read_version function")
        self.host = host
        self.supported_series = tuple(supported_series)
        self.supported_description = supported_description
        self.allow_env = allow_env
        self.error = error
        self._read = read_version or (lambda: distribution_version(distribution))
        self._missing = missing or f"unknown (no '{distribution}' distribution metadata)"
        self._install_hint = install_hint
        self._in_use = in_use
        self._still_checked = still_checked
        self._cache: list = []

    def version(self) -> str:
        """The installed version (read once per process), or a sentence saying why it is unknown."""
        if not self._cache:
            self._cache.append(self._read() or self._missing)
        return self._cache[0]

    def check(self, version: Optional[str] = None) -> str:
        """Return ``version`` (default: the installed one) if supported or overridden; raise ``error`` otherwise."""
        version = self.version() if version is None else version
        if version_allowed(version, self.supported_series, self.allow_env):
            return version
        hint = f"{self._install_hint}, or " if self._install_hint else ""
        raise self.error(
            f"rlhf_ext supports {self.host} {self.supported_description}, but {self.host} {version} is "
            f"{self._in_use}; {hint}set {self.allow_env}=1 to try anyway ({self._still_checked})"
        )

    def patch_registry(self) -> PatchRegistry:
        """A registry of this host's patches that checks this release rule before applying any."""
        return PatchRegistry(self.host, self.check, self.error)


REGISTRY_FUNCTIONS = ("register", "patch_modules", "check_module", "apply_module", "record", "applied", "original",
                      "undo_all", "verify_all")  # fmt: skip


def registry_functions(registry: PatchRegistry, module_name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562) handing out ``registry``'s functions by name.

    ``__getattr__ = registry_functions(RELEASE.patch_registry(), __name__)`` in a host's ``compat`` module makes
    ``compat.register``, ``compat.apply_module``, ... (and ``from .compat import verify_all``) the
    registry's bound methods, and the registry's state ``compat._registry`` / ``_applied_modules``
    for tests that reset one module of it.
    """

    def __getattr__(name: str):
        if name in REGISTRY_FUNCTIONS or name in ("_registry", "_applied_modules"):
            return getattr(registry, name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["REGISTRY_FUNCTIONS", "HostRelease", "distribution_version", "registry_functions"]
