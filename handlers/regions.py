"""Regions: which region a zone is in, and what moving a job's checkpoint between regions costs.

Zone names carry their region on both clouds (AWS ``us-west-2b`` in ``us-west-2``; Alibaba ``cn-hangzhou-h`` in
``cn-hangzhou``, ``ap-southeast-1a`` in ``ap-southeast-1``; the local cloud's ``local-a`` in ``local``), so a zone
name alone says where a job runs, and the spot authority's candidates stay keyed by zone: (region, zone, market)
with the region read from the zone.
"""

from __future__ import annotations

import re

_LETTER_AFTER_DIGIT = re.compile(r"^(?P<region>.+\d)[a-z]$")  # us-west-2b, ap-southeast-1a
_LETTER_AFTER_DASH = re.compile(r"^(?P<region>.+)-[a-z]$")  # cn-hangzhou-h, local-a

# AWS's published price of data moved between two regions (most pairs, per GB; the source region bills it).
AWS_TRANSFER_PRICE_PER_GB = 0.02


def region_of(zone: str) -> str:
    """The region ``zone`` is in (the zone itself when its name does not say: a bare name has no region)."""
    found = _LETTER_AFTER_DIGIT.fullmatch(zone) or _LETTER_AFTER_DASH.fullmatch(zone)
    return found.group("region") if found else zone


def transfer_cost(size_bytes: int, price_per_gb: float) -> float:
    """Dollars to move ``size_bytes`` between regions at ``price_per_gb`` (GB of 10^9 bytes, as clouds bill)."""
    return max(size_bytes, 0) / 1e9 * price_per_gb
