"""A run whose peer died ends fast, says why, and leaves nothing behind.

The weight-sync rendezvous runs on a real torch TCP store; the supervisor runs real process trees
(including a child that starts its own session, as Ray's daemons do).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from rlhf_ext.patches.retarget.rendezvous import (
    ENV_SYNC_TIMEOUT,
    WeightSyncRendezvousError,
    ack_key,
    bounded_store,
    join_key,
    peers_checked_by,
    rendezvous,
    sync_timeout,
    wait_for_ranks,
)
from rlhf_ext.tours.smoke import run_training
from rlhf_ext.ground.supervision import DeathWatch, ProcessTree, failure_cause


def test_sync_timeout_setting():
    assert sync_timeout({}) == 1800.0
    assert sync_timeout({ENV_SYNC_TIMEOUT: "90"}) == 90.0
    for bad in ("soon", "0", "-5"):
        with pytest.raises(WeightSyncRendezvousError, match=ENV_SYNC_TIMEOUT):
            sync_timeout({ENV_SYNC_TIMEOUT: bad})


def test_all_ranks_join_and_share_the_store(free_port):
    port = free_port()
    stores = {}

    def join(rank):
        stores[rank] = rendezvous("127.0.0.1", port, rank, 3, timeout=30)

    threads = [threading.Thread(target=join, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    stores[0] = rendezvous("127.0.0.1", port, 0, 3, timeout=30)
    for t in threads:
        t.join(30)
    assert sorted(stores) == [0, 1, 2]
    stores[2].set("hello", "from 2")
    assert stores[0].get("hello") == b"from 2"


def test_missing_ranks_are_named_after_the_timeout(free_port):
    port = free_port()
    threading.Thread(target=lambda: bounded_store("127.0.0.1", port, 1, 3, 10).set(join_key(1), "1"),
                     daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(WeightSyncRendezvousError) as err:
        rendezvous("127.0.0.1", port, 0, 3, timeout=2)
    assert time.monotonic() - t0 < 10
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "1 of 3 ranks never joined" in message
    assert "vLLM engine worker rank 2" in message and "rank 1" not in message.replace("rank 1 ", "")
    assert "OpenRLHF weight sync" in message and ENV_SYNC_TIMEOUT in message


def test_a_dead_peer_ends_the_wait_with_its_cause_long_before_the_timeout(free_port):
    port = free_port()
    calls = []

    def check():
        calls.append(time.monotonic())
        return "vLLM engine 0 died: ActorDiedError: ValueError: Available memory on node 0 is less" if len(calls) > 1 \
            else None

    t0 = time.monotonic()
    with peers_checked_by(check), pytest.raises(WeightSyncRendezvousError) as err:
        rendezvous("127.0.0.1", port, 0, 2, timeout=600)
    assert time.monotonic() - t0 < 30
    assert "a peer died before joining" in str(err.value) and "Available memory on node 0" in str(err.value)
    assert "vLLM engine worker rank 1" in str(err.value)
    # outside the block nothing is checked any more
    with peers_checked_by(None):
        pass


def test_wait_for_ranks_checks_liveness_only_on_schedule():
    class Store:
        def __init__(self):
            self.keys = set()

        def set(self, key, value):
            self.keys.add(key)

        def check(self, keys):
            return all(k in self.keys for k in keys)

    store, now = Store(), [0.0]
    checks = []

    def check():
        checks.append(now[0])
        if len(checks) == 3:
            store.set(join_key(1), "1")  # the engine finally joins...
            store.set(ack_key(1), "1")  # ...and sees the group complete
        return None

    def clock():
        now[0] += 0.5
        return now[0]

    wait_for_ranks(store, 0, 2, host="h", port=1, timeout=60, peer_check=check, clock=clock)
    assert len(checks) == 3 and all(b - a >= 2.0 for a, b in zip(checks, checks[1:]))


# ------------------------------------------------------------------ supervisor


def test_death_watch_waits_for_the_grace_period():
    now = [0.0]
    watch = DeathWatch(grace=5, clock=lambda: now[0])
    watch.feed("(PolicyModelActor pid=3) loading\n")
    assert not watch.seen
    watch.feed("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task\n")
    assert watch.seen and not watch.dead
    now[0] = 4.9
    assert not watch.dead
    now[0] = 5.0
    assert watch.dead and "ActorDiedError" in watch.first_line


def test_failure_cause_keeps_each_error_once_root_cause_last():
    log = "\n".join([
        "(PolicyModelActor pid=5) INFO loading model",
        "(RolloutRayActor pid=7) Traceback (most recent call last):",
        '(RolloutRayActor pid=7)   File "x.py", line 3, in __init__',
        "(RolloutRayActor pid=7) ValueError: Available memory on node 0 (6.32/12.21 GiB) on kv cache allocation is "
        "less than requested memory for kv (-0.07/0.61 GiB)",
        "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task",
        "(PolicyModelActor pid=5) ray.exceptions.ActorDiedError: The actor died because of an error raised in its "
        "creation task",
        "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task",
    ])  # fmt: skip
    cause = failure_cause(log)
    assert cause[-1].startswith("ValueError: Available memory on node 0")
    assert cause.count("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation "
                       "task") == 1
    assert not any(line.startswith("(") or "Traceback" in line or "INFO" in line for line in cause)
    assert failure_cause("all good\nstep 1 done") == []


_ORPHAN_MAKER = r"""
import os, pathlib, subprocess, sys, time
# a JIT build in progress, as DeepSpeed's first use of a CPU op does: its lock exists until it ends
lock = pathlib.Path(os.environ["TORCH_EXTENSIONS_DIR"], "py311_cpu", "deepspeed_shm_comm", "lock")
lock.parent.mkdir(parents=True, exist_ok=True)
lock.touch()
# a grandchild in a session of its own, like Ray's daemons: killing our process group misses it
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # orphan of a dead run"], start_new_session=True)
print("(RolloutRayActor pid=%d) ValueError: cannot allocate the KV cache" % os.getpid(), flush=True)
print("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task", flush=True)
time.sleep(600)
"""


def test_run_training_stops_at_a_dead_actor_and_kills_every_descendant(tmp_path):
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    extensions = tmp_path / "torch_extensions"
    old_lock = extensions / "py311_cpu" / "fused_adam" / "lock"  # some earlier job's: not ours to remove
    old_lock.parent.mkdir(parents=True)
    old_lock.touch()
    os.utime(old_lock, (time.time() - 3600, time.time() - 3600))
    t0 = time.monotonic()
    rc = run_training([sys.executable, "-c", _ORPHAN_MAKER], tmp_path / "t.log", timeout=300, echo=False,
                      death_grace=1, env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    elapsed = time.monotonic() - t0
    assert rc != 0 and elapsed < 60
    text = (tmp_path / "t.log").read_text()
    assert "rlhf_ext: stopped the run: a process died" in text
    assert failure_cause(text)[-1] == "ValueError: cannot allocate the KV cache"
    # the killed build's lock would hang every later run on the machine: gone; the older one stays
    assert not (extensions / "py311_cpu" / "deepspeed_shm_comm" / "lock").exists()
    assert "removed the build lock" in text and old_lock.exists()
    time.sleep(0.5)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
                 and "# orphan of a dead run" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert leftovers == []


def test_process_tree_kill_all_ignores_reused_pids():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tree = ProcessTree(child.pid)
    tree.known[child.pid] = 0.0  # recorded with another start time: not the same process any more
    assert tree.alive() == []
    child.kill()
    child.wait()
