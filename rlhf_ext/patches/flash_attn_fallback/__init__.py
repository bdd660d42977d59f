"""Serve a pure-torch ``flash_attn`` when the real package is not installed (CPU, Ascend).

:func:`install` appends a finder to the *end* of ``sys.meta_path``. Python consults it only after
every regular finder has failed to find ``flash_attn``, so an installed flash-attn always wins;
otherwise ``import flash_attn`` loads the package in ``./flash_attn`` of this directory under the
name ``flash_attn``, and its submodules resolve through that package's ``__path__``.
"""

from __future__ import annotations

import os
import sys
import threading

FALLBACK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_attn")

_lock = threading.Lock()


class FlashAttnFallbackFinder:
    """Meta-path finder answering only for the top-level name ``flash_attn``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "flash_attn":
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(
            "flash_attn",
            os.path.join(FALLBACK_DIR, "__init__.py"),
            submodule_search_locations=[FALLBACK_DIR],
        )

    def __repr__(self) -> str:
        return "<rlhf_ext flash_attn fallback finder>"


_finder = FlashAttnFallbackFinder()


def install() -> None:
    """Make ``import flash_attn`` fall back to the pure-torch modules; idempotent, thread-safe."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.append(_finder)


def uninstall() -> None:
    """Remove the finder (tests); an already imported fallback stays in ``sys.modules``."""
    with _lock:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def is_installed() -> bool:
    return _finder in sys.meta_path


def real_flash_attn_available() -> bool:
    """Whether a real ``flash_attn`` is importable, looking past this fallback."""
    for finder in sys.meta_path:
        if finder is _finder or not hasattr(finder, "find_spec"):
            continue
        try:
            if finder.find_spec("flash_attn", None) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def is_fallback(module) -> bool:
    """Whether ``module`` (e.g. ``sys.modules["flash_attn"]``) is this fallback rather than flash-attn."""
    return bool(getattr(module, "RLHF_EXT_FALLBACK", False))


__all__ = ["FALLBACK_DIR", "install", "uninstall", "is_installed", "is_fallback", "real_flash_attn_available"]
