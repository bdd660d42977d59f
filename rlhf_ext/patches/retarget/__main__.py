"""``python -m rlhf_ext.patches.retarget``: list OpenRLHF's CUDA-specific sites and check the retarget covers them."""

import sys

from rlhf_ext.patches.retarget.inventory import main

sys.exit(main())
