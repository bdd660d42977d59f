"""The replacement ledger: a record of every attribute rlhf_ext's device shims and retarget patches
replace, so each patch is applied once, its original stays reachable, and tests can undo all of them.

Replacements installed here are often plain module-level functions that fetch the original
through :func:`original` at call time: such a function pickles by reference, so it keeps working
when Ray ships a class that holds it to another process (cloudpickle copies Ray actor classes by
value, but a function importable by name travels as that name).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

_MISSING = object()


@dataclass
class _Entry:
    owner: Any
    name: str
    original: Any
    replacement: Any


_lock = threading.RLock()
_entries: Dict[Tuple[int, str], _Entry] = {}
_order: List[Tuple[int, str]] = []


def replace(owner: Any, name: str, replacement: Any) -> Any:
    """Set ``owner.name = replacement`` and return the original value.

    Idempotent: replacing an attribute that already holds this patch's replacement changes
    nothing and returns the first original, so a wrapper never wraps itself.
    """
    key = (id(owner), name)
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            # Already ours: keep the first original so a second application never wraps a wrapper.
            entry.replacement = replacement
            setattr(owner, name, replacement)
            return None if entry.original is _MISSING else entry.original
        original = getattr(owner, name, _MISSING)
        _entries[key] = _Entry(owner, name, original, replacement)
        _order.append(key)
        setattr(owner, name, replacement)
        return None if original is _MISSING else original


def replace_function(owner: Any, name: str, replacement: Callable) -> Any:
    """:func:`replace` for a function or method, which keeps presenting the original's signature.

    Other patch layers (rlhf_ext's OpenRLHF plugin among them) check a seam's parameter list before
    wrapping it, whichever layer came first; ``inspect.signature`` reads ``__signature__``.
    """
    current = getattr(owner, name)
    try:
        replacement.__signature__ = inspect.signature(current)
    except (TypeError, ValueError):
        pass
    return replace(owner, name, replacement)


def original(owner: Any, name: str) -> Any:
    """The value ``owner.name`` had before :func:`replace`, or its current value if never replaced."""
    entry = _entries.get((id(owner), name))
    if entry is None:
        return getattr(owner, name)
    if entry.original is _MISSING:
        raise AttributeError(f"{owner!r} had no attribute {name!r} before rlhf_ext set it")
    return entry.original


def is_replaced(owner: Any, name: str) -> bool:
    return (id(owner), name) in _entries


def wrap(owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> Any:
    """Replace ``owner.name`` by ``make_wrapper(original)`` unless it was already replaced; returns it."""
    with _lock:
        key = (id(owner), name)
        if key in _entries:
            return _entries[key].replacement
        wrapper = make_wrapper(getattr(owner, name))
        replace(owner, name, wrapper)
        return wrapper


def restore(owner: Any, name: str) -> bool:
    """Undo one replacement; returns whether there was one."""
    key = (id(owner), name)
    with _lock:
        entry = _entries.pop(key, None)
        if entry is None:
            return False
        _order.remove(key)
        _put_back(entry)
        return True


def _put_back(entry: _Entry) -> None:
    if entry.original is _MISSING:
        try:
            delattr(entry.owner, entry.name)
        except AttributeError:
            pass
    else:
        setattr(entry.owner, entry.name, entry.original)


def restore_all() -> int:
    """Undo every replacement, newest first; returns how many were undone."""
    with _lock:
        count = 0
        for key in reversed(_order):
            _put_back(_entries.pop(key))
            count += 1
        _order.clear()
        return count


def replaced_names() -> List[str]:
    """``"<owner>.<name>"`` for each live replacement, in the order applied (for logs and tests)."""
    return [f"{_describe(_entries[key].owner)}.{_entries[key].name}" for key in _order]


def _describe(owner: Any) -> str:
    if isinstance(owner, type(threading)):
        return owner.__name__
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return repr(owner)


__all__ = ["is_replaced", "original", "replace", "replace_function", "replaced_names", "restore", "restore_all", "wrap"]
