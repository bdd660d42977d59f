"""verl's entry point (group ``verl.plugins``, name ``rlhf_ext``): importing this module activates
the plugin. verl imports it at ``import verl`` unless ``VERL_USE_EXTERNAL_PLUGINS`` is ``none`` or
a list of plugin names without ``rlhf_ext``."""

from . import activate

activate()
