"""How long ``scripts/setup_env.sh`` takes with pip and with uv: the three environments, from nothing.

Each side gets a fresh clone of this checkout's HEAD and an empty package cache of its own, so neither
reuses the other's downloads or venvs; the two run one after the other (``--repeats`` alternates
them). Prints each run's wall and CPU seconds (the setup's whole process tree, from ``RUSAGE_CHILDREN``),
the per-step times the setup log prints, and the ratio of the means:

    .venv/bin/python benchmarks/setup_installer.py                  (about 8 minutes on 2 cores)
    .venv/bin/python benchmarks/setup_installer.py --repeats 2 --keep /tmp/setup-bench

Needs network access to the package indexes pip is configured with, as the setup itself does.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALLERS = ("pip", "uv")
STEP = re.compile(r"^== \[\s*(\d+) s\] (.*)$")


class SetupFailed(RuntimeError):
    pass


def one_setup(installer: str, where: Path) -> dict:
    clone = where / f"clone-{installer}"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    cache = where / f"cache-{installer}"
    env = {**os.environ, "RLHF_EXT_INSTALLER": installer,
           "PIP_CACHE_DIR": str(cache / "pip"), "UV_CACHE_DIR": str(cache / "uv")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=clone, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = done.stdout + done.stderr
    (where / f"setup-{installer}.log").write_text(log)
    if done.returncode != 0:  # raised before main's cleanup, which keeps the folder and this log for it
        raise SetupFailed(f"setup with {installer} failed (exit {done.returncode}); its log: "
                          f"{where}/setup-{installer}.log")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    steps = [(int(m.group(1)), m.group(2)) for m in map(STEP.match, log.splitlines()) if m]
    return {"wall": wall, "cpu": cpu, "steps": steps, "clone": clone, "cache": cache}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="setups per installer, alternating (default 1)")
    ap.add_argument("--keep", type=Path, help="keep the clones, caches and logs here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    where = args.keep or Path(tempfile.mkdtemp(prefix="setup-bench-", dir=REPO.parent))
    where.mkdir(parents=True, exist_ok=True)
    results = {name: [] for name in INSTALLERS}
    failed = None
    try:
        for i in range(args.repeats):
            for name in INSTALLERS:
                print(f"[{i + 1}/{args.repeats}] setup_env.sh with {name} ...", flush=True)
                run = one_setup(name, where / f"{name}-{i}")
                results[name].append(run)
                print(f"  wall {run['wall']:6.0f} s   cpu {run['cpu']:6.0f} s", flush=True)
                for sec, what in run["steps"]:
                    print(f"    [{sec:4d} s] {what}")
                if not args.keep:
                    shutil.rmtree(run["clone"], ignore_errors=True)
                    shutil.rmtree(run["cache"], ignore_errors=True)
    except SetupFailed as exc:
        failed = str(exc)
    finally:
        if not args.keep and failed is None:
            shutil.rmtree(where, ignore_errors=True)
    if failed:
        sys.exit(failed)
    walls = {name: statistics.mean(r["wall"] for r in runs) for name, runs in results.items()}
    cpus = {name: statistics.mean(r["cpu"] for r in runs) for name, runs in results.items()}
    print(f"\n{'installer':10} {'wall s':>8} {'cpu s':>8}")
    for name in INSTALLERS:
        print(f"{name:10} {walls[name]:8.0f} {cpus[name]:8.0f}")
    print(f"uv / pip: wall {walls['uv'] / walls['pip']:.2f}x, cpu {cpus['uv'] / cpus['pip']:.2f}x "
          f"({args.repeats} setup(s) each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
