"""``python -m rlhf_ext.alignment``: the same command as ``rlhf-ext alignment``."""

import os
import sys

from .check import main

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
