"""Ctrl-C during a run: what finished is kept, and an engine that died of the same Ctrl-C counts as
the interruption, not as a crash (exit 130, status "interrupted")."""

from __future__ import annotations

import time

from . import records


class EvalInterrupted(Exception):
    """The run was stopped (Ctrl-C); what finished is saved and a rerun completes it."""


def interrupted_message(run) -> str:
    return (f"interrupted: finished samples are saved in {run.output / records.SAMPLES_FILE}; rerun the "
            "same command (or add --resume) to generate the rest")


def sigint_follows(wait: float = 1.0) -> bool:
    """Whether this process gets a SIGINT within ``wait`` seconds.

    Ctrl-C reaches the whole process group: vLLM's engine process can die of it, and generation fail
    with an engine error, a moment before this process handles its own SIGINT. That failure is the
    interruption, not a crash (exit 130, status "interrupted"). Only the main thread receives signals.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        time.sleep(wait)
    except KeyboardInterrupt:
        return True
    return False
