"""The policy losses that change how the importance ratio enters the gradient, under the name they were
first published at; each lives in the module of its family (see :mod:`.ratio_common`):

* :mod:`.token_weight_losses`: ``cispo``, ``sapo``;
* :mod:`.sequence_losses`: ``gmpo`` (also ``geo_mean``), ``luspo``, ``vespo``;
* :mod:`.covariance_losses`: ``clip_cov``, ``kl_cov``;
* :mod:`.dppo_losses`: ``dppo_tv``, ``dppo_kl``.

Importing :mod:`rlhf_ext.algorithms` registers them all.
"""

from __future__ import annotations

from .covariance_losses import clip_cov, kl_cov
from .dppo_losses import dppo_kl, dppo_tv
from .ratio_common import Metrics
from .sequence_losses import gmpo, luspo, vespo
from .token_weight_losses import cispo, sapo

__all__ = ["Metrics", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "gmpo", "kl_cov", "luspo", "sapo", "vespo"]
