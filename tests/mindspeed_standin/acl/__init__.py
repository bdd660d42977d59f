"""Stand-in for `acl` (tests only; see ../rlhf_ext_standin_core.py): submodules and names on demand."""

import sys

import rlhf_ext_standin_core as _core

_core.install()
_core.add_auto_attributes(sys.modules[__name__])
