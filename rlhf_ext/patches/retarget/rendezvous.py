"""A bounded rendezvous for the DeepSpeed -> vLLM weight-sync group.

OpenRLHF forms the group between DeepSpeed rank 0 (the policy actor, rank 0 here) and every vLLM
engine worker (ranks 1..N) over a TCP store. If an engine died before it joined, rank 0 used to
wait in that store for an engine that no longer exists until an outside watchdog killed the job,
and the user saw a timeout instead of the cause. Here every rank announces itself under its own
key, waits for the others with a deadline (``RLHF_EXT_SYNC_TIMEOUT`` seconds, default 1800, the
same as torch.distributed's default), and, on rank 0, checks every few seconds that the engines it
is waiting for are still alive. Either failure raises :class:`WeightSyncRendezvousError` naming the
group, the address and the ranks that never joined, with the dead engine's own error when there is one.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from datetime import timedelta
from typing import Callable, Iterator, List, Optional, Sequence

from rlhf_ext.patches.retarget.guard import RetargetError

ENV_SYNC_TIMEOUT = "RLHF_EXT_SYNC_TIMEOUT"
DEFAULT_SYNC_TIMEOUT = 1800.0
GROUP_NAME = "OpenRLHF weight sync (DeepSpeed rank 0 + vLLM engine workers)"
_POLL_S = 0.5
_LIVENESS_EVERY_S = 2.0

PeerCheck = Callable[[], Optional[str]]
"""Returns a description of a dead peer (its error), or None while all are alive."""

_peer_check = threading.local()


class WeightSyncRendezvousError(RetargetError):
    """A weight-sync group could not be formed: a peer died or never joined in time."""


def sync_timeout(env=None) -> float:
    """Seconds to wait for every rank of the group (``RLHF_EXT_SYNC_TIMEOUT``, default 1800)."""
    env = os.environ if env is None else env
    text = env.get(ENV_SYNC_TIMEOUT, "")
    if not text:
        return DEFAULT_SYNC_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise WeightSyncRendezvousError(f"{ENV_SYNC_TIMEOUT} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise WeightSyncRendezvousError(f"{ENV_SYNC_TIMEOUT} must be positive, got {text!r}")
    return value


@contextlib.contextmanager
def peers_checked_by(check: Optional[PeerCheck]) -> Iterator[None]:
    """Within the block, rank 0's rendezvous in this thread calls ``check`` while it waits."""
    previous = getattr(_peer_check, "value", None)
    _peer_check.value = check
    try:
        yield
    finally:
        _peer_check.value = previous


def ray_actors_alive_check(actors: Sequence) -> PeerCheck:
    """A :data:`PeerCheck` for Ray actors: a finished ``__ray_ready__`` call that raised means dead."""
    import ray

    refs = [actor.__ray_ready__.remote() for actor in actors]
    pending = list(refs)

    def check() -> Optional[str]:
        nonlocal pending
        if not pending:
            return None
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 -- ActorDiedError and friends: report, whatever the type
                message = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray colours the actor's name
                return f"vLLM engine {refs.index(ref)} died: {type(exc).__name__}: {message}"
        return None

    return check


def _rank_role(rank: int) -> str:
    return "DeepSpeed rank 0" if rank == 0 else f"vLLM engine worker rank {rank}"


def join_key(rank: int) -> str:
    return f"rlhf_ext/joined/{rank}"


def ack_key(rank: int) -> str:
    return f"rlhf_ext/complete/{rank}"


def wait_for_ranks(store, rank: int, world_size: int, *, host: str, port: int, timeout: float,
                   peer_check: Optional[PeerCheck] = None, clock: Callable[[], float] = time.monotonic) -> None:
    """Announce ``rank`` in ``store`` and wait until all ``world_size`` ranks did, within ``timeout`` s."""
    store.set(join_key(rank), "1")
    deadline = clock() + timeout
    next_liveness = clock()
    missing: List[int] = list(range(world_size))
    while True:
        missing = [r for r in missing if not store.check([join_key(r)])]
        if not missing:
            break
        now = clock()
        if peer_check is not None and now >= next_liveness:
            dead = peer_check()
            if dead:
                raise WeightSyncRendezvousError(
                    f"{GROUP_NAME} at {host}:{port}: a peer died before joining; ranks never joined: "
                    f"{', '.join(_rank_role(r) for r in missing)}. Cause: {dead}"
                )
            next_liveness = now + _LIVENESS_EVERY_S
        if now >= deadline:
            raise WeightSyncRendezvousError(
                f"{GROUP_NAME} at {host}:{port}: after {timeout:.0f} s, {len(missing)} of {world_size} ranks never "
                f"joined: {', '.join(_rank_role(r) for r in missing)}. Look for their errors above (a vLLM engine "
                f"that failed to start, a node that cannot reach {host}:{port}); {ENV_SYNC_TIMEOUT} sets the wait"
            )
        time.sleep(_POLL_S)
    # Rank 0 hosts the store: it leaves only once every rank has seen the group complete, so a
    # peer still polling never finds the store gone (e.g. when rank 0 fails right afterwards).
    store.set(ack_key(rank), "1")
    if rank == 0:
        pending = list(range(1, world_size))
        while pending and clock() < deadline:
            pending = [r for r in pending if not store.check([ack_key(r)])]
            if pending:
                time.sleep(_POLL_S / 10)


def bounded_store(host: str, port: int, rank: int, world_size: int, timeout: float):
    """A TCP store whose server (rank 0) does not block waiting for clients; clients give up after ``timeout``."""
    from torch.distributed import TCPStore

    try:
        return TCPStore(host, port, world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout),
                        wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 -- torch raises several types for a refused/expired connection
        raise WeightSyncRendezvousError(
            f"{GROUP_NAME}: {_rank_role(rank)} could not {'listen on' if rank == 0 else 'reach'} {host}:{port} "
            f"within {timeout:.0f} s ({type(exc).__name__}: {exc})"
        ) from exc


def rendezvous(host: str, port: int, rank: int, world_size: int, timeout: Optional[float] = None):
    """The group's store once every rank has joined (see the module docstring)."""
    timeout = sync_timeout() if timeout is None else timeout
    store = bounded_store(host, port, rank, world_size, timeout)
    check = getattr(_peer_check, "value", None) if rank == 0 else None
    wait_for_ranks(store, rank, world_size, host=host, port=port, timeout=timeout, peer_check=check)
    return store


__all__ = [
    "DEFAULT_SYNC_TIMEOUT",
    "ENV_SYNC_TIMEOUT",
    "GROUP_NAME",
    "WeightSyncRendezvousError",
    "ack_key",
    "bounded_store",
    "join_key",
    "peers_checked_by",
    "ray_actors_alive_check",
    "rendezvous",
    "sync_timeout",
    "wait_for_ranks",
]
