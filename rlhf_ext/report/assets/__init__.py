"""The report page's style and script, as files beside this module (``page.css``, ``page.js``),
read when a page is rendered and inlined into it (the page needs no network access). Shipped as
package data (setup.py ``package_data``)."""

from __future__ import annotations

import functools
from importlib import resources


@functools.lru_cache(maxsize=None)
def text(name: str) -> str:
    """The text of the asset ``name`` (``page.css``, ``page.js``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
