"""Which Alibaba Cloud ECS errors mean "try another zone or type" when launching a preemptible instance.

The ordering itself is the cloud-neutral one of :mod:`handlers.placement` (spot price, configured zone order,
avoided zones last); only the error codes differ. ECS answers ``RunInstances`` with a ``Code`` such as
``OperationDenied.NoStock``; this module sorts them into the plan's three kinds.
"""

from __future__ import annotations

from handlers.placement import ErrorKind

# Nothing left of this (zone, type) right now, or no room for more: another zone / type / market may have it.
# These count towards the switch to on-demand.
ALIYUN_CAPACITY_ERRORS = frozenset(
    {
        "OperationDenied.NoStock",  # sold out in this zone
        "Zone.NotOnSale",  # the zone sells none of this now
        "OperationDenied.ZoneNotAllowed",
        "QuotaExceed.ElasticQuota",  # vCPU quota of the zone used up
        "QuotaExceed.PostPaidInstance",
        "InvalidSpotPriceLimit.LowerThanPublicPrice",  # our price limit is below the market price
        "OperationDenied.SpotPriceLimitTooLow",
    }
)
# This candidate cannot work (the type is not offered in that zone, the vSwitch is full, the API is busy), but the
# next one may: move on without counting it as a capacity failure.
ALIYUN_SKIP_ERRORS = frozenset(
    {
        "InvalidResourceType.NotSupported",  # this type is not offered in this zone
        "InvalidInstanceType.ValueNotSupported",
        "InvalidInstanceType.NotSupported",
        "Zone.NotOpen",
        "InvalidZoneId.NotFound",
        "InvalidVSwitchId.IpNotEnough",
        "OperationDenied.ZoneSystemCategoryNotMatch",  # the system disk category is not sold in this zone
        "InvalidSystemDiskCategory.ValueNotSupported",
        "OperationDenied.CloudSSDNotSupported",
        "Throttling",
        "Throttling.User",
        "Throttling.Api",
        "ServiceUnavailable",
        "InternalError",
        "UnknownError",
    }
)


def classify_aliyun_launch_error(code: str) -> ErrorKind:
    """``capacity`` and ``skip``: try the next candidate; anything else (bad image, no permission, unpaid
    account, a vSwitch that does not exist) is ``fatal``: every other candidate would fail the same way."""
    if code in ALIYUN_CAPACITY_ERRORS:
        return "capacity"
    if code in ALIYUN_SKIP_ERRORS:
        return "skip"
    return "fatal"
