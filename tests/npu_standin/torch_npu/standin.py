"""Call recorder shared by the stand-in torch_npu and vllm_ascend (tests only)."""

import threading

CALLS = []
_lock = threading.Lock()


def record(name, *args, **kwargs):
    with _lock:
        CALLS.append((name, args, kwargs))


def calls(name=None):
    """Recorded calls, optionally only those named ``name``."""
    with _lock:
        return [c for c in CALLS if name is None or c[0] == name]


def clear():
    with _lock:
        CALLS.clear()
