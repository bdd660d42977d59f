"""Print, one per line, the ``uv pip install`` options that make uv read the same indexes as this pip.

uv does not read pip's configuration (pip.conf files, ``PIP_*`` variables). Machines of this project's
kind point pip at local wheel folders and file:// indexes (``pip config list``), and cap versions through
a constraints file; the setup scripts install with uv and must see the same packages. Read with the
venv's own pip (``python -m pip config list``), the effective values of index-url, extra-index-url,
find-links, no-index, constraint and trusted-host become uv's options. ``--index-strategy
unsafe-best-match`` makes uv pick the best version across all indexes, as pip does (uv's default stops
at the first index that has the package). uv has no option for pip's ``cert``: ``--cert`` prints it,
and the caller exports it as ``SSL_CERT_FILE``. What is not translated (a proxy, a client certificate)
makes uv fail where pip would not, and the caller then installs with pip.

Usage: python uv_args_from_pip.py [--cert]   (run by scripts/lib/installer.sh)
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# What `pip install` reads, lowest precedence first: a later scope's value of an option replaces an
# earlier one's; other sections ([download], [freeze], ...) belong to other pip commands
SCOPES = ("global", "install", ":env:")
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
                "trusted-host": "--allow-insecure-host"}


def pip_config() -> dict:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True,
                         text=True).stdout
    ranked = []
    for line in out.splitlines():
        key, sep, raw = line.partition("=")
        scope, _, option = key.rpartition(".")
        if sep and scope in SCOPES:
            ranked.append((SCOPES.index(scope), option, raw))
    values: dict = {}
    for _, option, raw in sorted(ranked, key=lambda r: r[0]):
        try:
            value = " ".join(shlex.split(raw))
        except ValueError:
            value = raw.strip("'\"")
        values[option] = value
    return values


def uv_args(config: dict) -> list:
    args = ["--index-strategy", "unsafe-best-match"]
    if config.get("index-url"):
        args += ["--index-url", config["index-url"]]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    for option, flag in LIST_OPTIONS.items():
        for item in config.get(option, "").split():
            args += [flag, item]
    return args


if __name__ == "__main__":
    config = pip_config()
    if sys.argv[1:] == ["--cert"]:
        print(config.get("cert", ""))
    elif sys.argv[1:]:
        sys.exit(f"usage: {sys.argv[0]} [--cert]")
    else:
        print("\n".join(uv_args(config)))
