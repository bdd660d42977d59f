"""What the rlhf_ext start-up hook costs a Python process that does not use it.

The hook (``rlhf_ext_startup.pth`` + ``rlhf_ext_startup.py`` in site-packages) runs in every
Python process of the environment: site executes the .pth line, which imports the module only
when a plugin may be requested. This benchmark builds two throwaway virtual environments from
the same interpreter, identical except that one holds the two hook files, and times
``python -c pass`` in both, alternating runs (in a shuffled order) so machine load hits both sides alike. It reports
the median, the 10th/90th percentiles, the ratio with/without and the absolute difference.

    python benchmarks/startup_hook_cost.py            # 300 runs per side
    python benchmarks/startup_hook_cost.py --runs 1000

A third row times the hook when a plugin *is* requested (``RLHF_EXT_PLUGINS=rlhf_ext``, with
rlhf_ext on ``PYTHONPATH``): the price paid only by processes of a plugin run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOOK_SOURCE = REPO / "rlhf_ext" / "patches" / "activation" / "site_hook" / "rlhf_ext_startup.py"
# The exact line setup.py installs (runpy: the installer module is not part of the import path).
PTH_LINE = __import__("runpy").run_path(str(HOOK_SOURCE.parent / "install.py"))["PTH_LINE"]


def _base_python() -> str:
    # Build the throwaway environments from the base interpreter, not from a venv's wrapper.
    return getattr(sys, "_base_executable", sys.executable)


def site_packages(python: Path) -> Path:
    return Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())  # fmt: skip


def make_env(path: Path, with_hook: bool) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    site = site_packages(python)
    if with_hook:
        shutil.copy(HOOK_SOURCE, site / "rlhf_ext_startup.py")
        (site / "rlhf_ext_startup.pth").write_text(PTH_LINE)
    return python


def time_run(python: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def hook_line_cost(repeats: int = 20000) -> float:
    """Seconds per execution of the .pth line when no plugin is requested (in-process).

    Isolates the hook's own work (one substring test, one variable lookup) from interpreter
    start-up noise; site runs the line the same way, with ``exec``.
    """
    code = compile(PTH_LINE, "rlhf_ext_startup.pth", "exec")
    saved_argv, saved_env = sys.argv, os.environ.pop("RLHF_EXT_PLUGINS", None)
    sys.argv = ["-c"]
    try:
        start = time.perf_counter()
        for _ in range(repeats):
            exec(code, {})
        return (time.perf_counter() - start) / repeats
    finally:
        sys.argv = saved_argv
        if saved_env is not None:
            os.environ["RLHF_EXT_PLUGINS"] = saved_env


def pth_file_cost(site_dir: Path, repeats: int = 2000) -> float:
    """Seconds for ``site`` to process the installed .pth file once (open, read, exec the line)."""
    import site

    saved = os.environ.pop("RLHF_EXT_PLUGINS", None)
    try:
        start = time.perf_counter()
        for _ in range(repeats):
            site.addpackage(str(site_dir), "rlhf_ext_startup.pth", {str(site_dir)})
        return (time.perf_counter() - start) / repeats
    finally:
        if saved is not None:
            os.environ["RLHF_EXT_PLUGINS"] = saved


def summary(name: str, samples, baseline=None) -> str:
    q = statistics.quantiles(samples, n=10)
    med = statistics.median(samples)
    line = f"{name:<34} median {med * 1e3:7.2f} ms   p10 {q[0] * 1e3:7.2f}   p90 {q[-1] * 1e3:7.2f}"
    if baseline is not None:
        base = statistics.median(baseline)
        line += f"   ratio {med / base:6.3f}   diff {(med - base) * 1e3:+6.2f} ms"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="runs per variant (default 300)")
    parser.add_argument("--no-requested", action="store_true", help="skip the 'plugin requested' row")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be >= 10 for percentiles")

    try:
        from tqdm import tqdm
    except ImportError:  # progress bar is optional
        tqdm = None

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RLHF_EXT_", "PYTHON"))}
    requested_env = dict(base_env, RLHF_EXT_PLUGINS="rlhf_ext", RLHF_EXT_QUIET="1", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory(prefix="rlhf_ext_hook_bench_") as tmp:
        without = make_env(Path(tmp) / "without", with_hook=False)
        with_hook = make_env(Path(tmp) / "with", with_hook=True)
        variants = [("python -c pass, no hook", without, base_env), ("python -c pass, hook installed", with_hook, base_env)]
        if not args.no_requested:
            variants.append(("hook installed, plugin requested", with_hook, requested_env))
        hook_site = site_packages(with_hook)
        for _, python, env in variants:  # warm the file-system caches
            time_run(python, env)
        samples = {name: [] for name, _, _ in variants}
        steps = range(args.runs)
        if tqdm is not None:
            steps = tqdm(steps, desc="runs", unit="round")
        file_cost = pth_file_cost(hook_site)
        rng = random.Random(0)
        for _ in steps:
            # interleaved, in a shuffled order each round: load changes and cache effects hit all alike
            for name, python, env in rng.sample(variants, len(variants)):
                samples[name].append(time_run(python, env))

    baseline = samples[variants[0][0]]
    print(f"interpreter: {_base_python()} (Python {sys.version.split()[0]}), {args.runs} runs per variant")
    for i, (name, _, _) in enumerate(variants):
        print(summary(name, samples[name], None if i == 0 else baseline))
    print(f"{'site reading the .pth (in-process)':<34} {file_cost * 1e6:7.2f} us per run")
    print(f"{'the .pth line alone (in-process)':<34} {hook_line_cost() * 1e6:7.2f} us per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
