"""Sources of the start-up hook that setup.py installs at the top of site-packages.

* ``rlhf_ext_startup.py`` becomes the top-level module ``rlhf_ext_startup``;
* ``rlhf_ext_startup.pth`` holds one line that imports ``rlhf_ext_startup`` only when ``--plugin`` is
  on the command line or ``RLHF_EXT_PLUGINS`` is set (see ``install.PTH_LINE``);
* ``install.py`` is the setuptools command that writes both (run by setup.py, not imported here).
"""
