"""``python -m rlhf_ext.cli``: the ``rlhf-ext`` command."""

import sys

from rlhf_ext.cli import main

if __name__ == "__main__":
    sys.exit(main())
