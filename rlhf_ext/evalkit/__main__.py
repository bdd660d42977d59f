"""``python -m rlhf_ext.evalkit`` is the ``evalkit`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
