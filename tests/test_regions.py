"""Zone names to regions on both clouds, and the transfer price arithmetic."""

from __future__ import annotations

import pytest

from handlers.regions import region_of, transfer_cost


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("us-west-2b", "us-west-2"),
        ("us-east-1a", "us-east-1"),
        ("ap-southeast-1a", "ap-southeast-1"),
        ("cn-hangzhou-h", "cn-hangzhou"),
        ("cn-beijing-k", "cn-beijing"),
        ("local-a", "local"),
        ("zone", "zone"),
    ],
)
def test_region_of_reads_the_region_from_the_zone_name(zone: str, region: str) -> None:
    assert region_of(zone) == region


def test_transfer_cost_is_gigabytes_times_the_price() -> None:
    assert transfer_cost(20_000_000_000, 0.02) == pytest.approx(0.40)
    assert transfer_cost(0, 0.02) == 0.0
