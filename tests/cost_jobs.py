"""Job records for the costs tests: jobs of two teams (and one of none) over a week, with round numbers.

Each job bills at a price per hour, trains at 36 s a step, and has one start-up of 0.1 h, so what it cost and
what on-demand would have cost are simple sums (``handlers/job_cost.py``). NOW is the injected clock's start.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handlers.jobs import Attempt, ChatRef, Job, JobState

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SLACK_CHANNEL, DINGTALK_GROUP = "C0TEAMML", "cidVision0001=="
ALICE, TINA, ADMIN = "slack:U0ALICE", "slack:U0TINA", "slack:U0ADMIN"
BOB, CAROL = "dingtalk:bob", "dingtalk:carol"


def hours(value: float) -> timedelta:
    return timedelta(hours=value)


def attempt(number: int, at: datetime, start_h: float, end_h: float, price: float, od: float | None) -> Attempt:
    return Attempt(
        number=number,
        instance_id=f"i-{number}{int(at.timestamp())}",
        price_per_hour=price,
        on_demand_price_per_hour=od,
        launched_at=at,
        started_at=at + hours(start_h),
        ended_at=at + hours(end_h),
    )


def ended_job(
    job_id: str, team: str | None, user: str, recipe: str, created: datetime, attempts: list[Attempt], **extra: object
) -> Job:
    chat = ChatRef(platform="slack", channel=SLACK_CHANNEL) if user.startswith("slack:") else None
    if user.startswith("dingtalk:"):
        chat = ChatRef(platform="dingtalk", channel=DINGTALK_GROUP)
    ended = attempts[-1].ended_at
    assert ended is not None
    return Job(
        id=job_id,
        recipe=recipe,
        requested_by=user,
        chat=chat,
        team=team,
        state=JobState.SUCCEEDED,
        attempts=attempts,
        created_at=created,
        updated_at=ended,
        **extra,  # type: ignore[arg-type]
    )


def week_of_jobs() -> list[Job]:
    """ml: alice's (paid 3.03, on-demand 10.10) and tina's two-attempt job (2.05 / 6.80, 20 steps lost, 0.5 h
    down); vision: bob's (1.53 / 5.10) this week and one 9 days ago (0.30 / 1.00); carol's with no team and no
    on-demand price (0.30, not compared)."""
    a_at, b_at, c_at, d_at, e_at = (
        NOW - timedelta(days=6),
        NOW - timedelta(days=3),
        NOW - timedelta(days=2),
        NOW - timedelta(days=9),
        NOW - timedelta(days=1),
    )
    return [
        ended_job("ft-aaaa", "ml", ALICE, "tiny", a_at, [attempt(1, a_at, 0.1, 10.1, 0.30, 1.00)], step=1000),
        ended_job(
            "ft-bbbb",
            "ml",
            TINA,
            "deepseek-7b",
            b_at,
            [attempt(1, b_at, 0.1, 2.1, 0.50, 2.00), attempt(2, b_at + hours(2.1), 0.5, 2.0, 0.50, 2.00)],
            step=330,
            steps_lost=20,
            interruptions=1,
            downtime_seconds=1800.0,
        ),
        ended_job("ft-cccc", "vision", BOB, "tiny", c_at, [attempt(1, c_at, 0.1, 5.1, 0.30, 1.00)], step=500),
        ended_job("ft-dddd", "vision", BOB, "tiny", d_at, [attempt(1, d_at, 0.1, 1.0, 0.30, 1.00)], step=90),
        ended_job("ft-eeee", None, CAROL, "tiny", e_at, [attempt(1, e_at, 0.1, 1.0, 0.30, None)], step=90),
    ]
