"""The gang's hold choice (handlers/spot/gang.py) at its corners, computed by hand.

Node-hours at one price: waiting one hold costs ``survivors · hold + p · nodes · replace + (1 - p) · nodes · (hold +
move)``, moving ``nodes · move``; a deadline whose slack would not cover one more hold and a move moves the gang.
"""

from __future__ import annotations

from typing import Any

import pytest

from handlers.spot.gang import GangHold, wait_or_move

MINUTE = 60.0


def hold(**changes: Any) -> GangHold:
    """Four nodes, three survivors, a 10-minute hold, one node back in 6 minutes against 60 for the whole gang."""
    values: dict[str, Any] = {
        "nodes": 4,
        "survivors": 3,
        "node_price_per_hour": 3.0,
        "waited_seconds": 10 * MINUTE,
        "hold_seconds": 10 * MINUTE,
        "replace_seconds": 6 * MINUTE,
        "move_seconds": 60 * MINUTE,
        "availability": 0.9,
    }
    values.update(changes)
    return GangHold(**values)


def test_no_survivors_means_nothing_to_wait_for() -> None:
    assert wait_or_move(hold(survivors=0, availability=1.0)) == "move"


def test_a_replacement_sure_to_come_is_waited_for() -> None:
    # 3·10 + 1·4·6 = 54 node-minutes against 4·60 = 240.
    assert wait_or_move(hold(availability=1.0)) == "wait"
    assert wait_or_move(hold(availability=1.7)) == "wait"  # clamped to 1


def test_a_replacement_that_cannot_come_is_not_waited_for() -> None:
    # 3·10 + 4·(10 + 60) = 310 node-minutes against 240.
    assert wait_or_move(hold(availability=0.0)) == "move"
    assert wait_or_move(hold(availability=-0.5)) == "move"  # clamped to 0


@pytest.mark.parametrize(
    ("hold_minutes", "expected"),
    [
        # p = 0.5: 3·h + 0.5·4·6 + 0.5·4·(h + 60) = 5h + 132 node-minutes against 240: wait while 5h < 108.
        (10, "wait"),  # 182 < 240
        (21, "wait"),  # 237 < 240
        (22, "move"),  # 242 > 240
        (60, "move"),
    ],
)
def test_a_long_hold_moves_where_a_short_one_waits(hold_minutes: int, expected: str) -> None:
    assert wait_or_move(hold(availability=0.5, hold_seconds=hold_minutes * MINUTE)) == expected


def test_a_restart_as_cheap_as_a_replacement_never_pays_for_the_wait() -> None:
    # Moving costs 4·6 = 24; waiting at least the survivors' 3·10 = 30.
    assert wait_or_move(hold(availability=1.0, move_seconds=6 * MINUTE)) == "move"


def test_the_deadline_bounds_the_wait() -> None:
    assert wait_or_move(hold(availability=1.0, slack_seconds=None)) == "wait"
    assert wait_or_move(hold(availability=1.0, slack_seconds=70 * MINUTE)) == "wait"  # a hold and a move fit
    assert wait_or_move(hold(availability=1.0, slack_seconds=69 * MINUTE)) == "move"
    assert wait_or_move(hold(availability=1.0, slack_seconds=-5 * MINUTE)) == "move"
