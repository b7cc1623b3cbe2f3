"""On-call decisions without I/O: the rota, the ladder's timing and targets, each step once, none after an ack."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from handlers.decide import ack_command, decide, resume_command, stop_command
from handlers.failures import Failure
from handlers.jobs import Attempt, Job, JobState, Page
from handlers.messages import PageStep, parse_message
from handlers.oncall import OnCall, on_shift, step_due, step_targets
from tests.outboxes import dumped

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

ONCALL = OnCall.model_validate(
    {
        "people": {
            "ana": {"slack": "U0ANA", "dingtalk": "ana01", "mobile": "+8613800000000"},
            "bo": {"slack": "U0BO"},
            "ml-leads": {"slack": "S0LEADS"},
        },
        "rota": [["ana", "bo"], ["bo", "ana"]],
        "shift_hours": 24,
        "rota_starts": "2026-11-30T09:00:00Z",
        "ladder": [
            {"after_minutes": 0, "notify": ["primary"]},
            {"after_minutes": 5, "notify": ["primary", "secondary"]},
            {"after_minutes": 15, "notify": ["channel", "ml-leads"]},
        ],
        "repeat_every_minutes": 10,
        "max_repeats": 2,
    }
)


def paged_job(opened: datetime = T0) -> Job:
    return Job(
        id="ft-ab12",
        recipe="tiny",
        requested_by="slack:U1",
        state=JobState.RESUME_FAILED,
        attempts=[Attempt(number=1), Attempt(number=2)],
        page=Page(attempt=2, opened_at=opened, reason=Failure.of("launch-failed", error="no capacity")),
    )


def step(job: Job, number: int, at: datetime) -> Any:
    return decide(job, PageStep(job_id=job.id, attempt=2, step=number, due=at), at, ONCALL)


def names(change: Any) -> list[str]:
    notify = next(item for item in dumped(change) if item["type"] == "notify")
    return [person["name"] for person in notify["note"]["mention"]] + [str(notify["note"]["everyone"])]


def test_the_rota_turns_every_shift() -> None:
    assert on_shift(ONCALL, T0) == ["ana", "bo"]
    assert on_shift(ONCALL, T0 + timedelta(days=1)) == ["bo", "ana"]
    assert on_shift(ONCALL, T0 + timedelta(days=2)) == ["ana", "bo"]
    assert on_shift(ONCALL, datetime(2026, 11, 30, 8, 59, tzinfo=UTC)) == ["bo", "ana"]  # before the start
    assert on_shift(OnCall(), T0) == []


def test_steps_fall_due_on_the_ladder_then_repeat_the_last() -> None:
    dues = [step_due(ONCALL, T0, number) - T0 for number in range(ONCALL.steps)]
    assert ONCALL.steps == 5
    assert dues == [timedelta(minutes=m) for m in (0, 5, 15, 25, 35)]


def test_each_step_names_the_people_on_shift_with_their_platform_ids() -> None:
    mention, everyone = step_targets(ONCALL, 0, T0)
    assert [p.model_dump() for p in mention] == [
        {"name": "ana", "slack": "U0ANA", "dingtalk": "ana01", "mobile": "+8613800000000"}
    ]
    assert everyone is None
    mention, everyone = step_targets(ONCALL, 2, T0)
    assert [p.name for p in mention] == ["ml-leads"] and everyone == "channel"
    mention, everyone = step_targets(OnCall(), 0, T0)  # nobody on the rota: the channel still hears it
    assert mention == [] and everyone == "here"


def test_the_ladder_walks_step_by_step_and_each_step_goes_once() -> None:
    job = paged_job()
    first = step(job, 0, T0)
    assert names(first) == ["ana", "None"] and first.job.page is not None and first.job.page.sent == 1
    following = next(item for item in dumped(first) if item["type"] == "page-step")
    timer = parse_message(following)
    assert isinstance(timer, PageStep) and timer.step == 1 and timer.due == T0 + timedelta(minutes=5)

    again = step(first.job, 0, T0 + timedelta(seconds=1))  # a redelivered or duplicated timer
    assert again.job == first.job and dumped(again) == [] and "not next" in again.history["why"]

    job = first.job
    for number, expected in ((1, ["ana", "bo", "None"]), (2, ["ml-leads", "channel"]), (3, ["ml-leads", "channel"])):
        change = step(job, number, T0 + timedelta(minutes=5 * number))
        assert names(change) == expected
        job = change.job
    last = step(job, 4, T0 + timedelta(minutes=35))
    assert [item["type"] for item in dumped(last)] == ["notify"]  # out of repeats: nothing more scheduled
    assert step(last.job, 5, T0 + timedelta(minutes=45)).history["why"] == "the ladder is exhausted"


def test_a_shift_change_during_the_page_calls_the_new_primary() -> None:
    job = paged_job(opened=datetime(2026, 12, 1, 8, 58, tzinfo=UTC))  # ana's shift ends at 09:00
    first = step(job, 0, job.page.opened_at)  # type: ignore[union-attr]
    assert names(first)[0] == "ana"
    second = step(first.job, 1, datetime(2026, 12, 1, 9, 3, tzinfo=UTC))
    assert names(second)[:2] == ["bo", "ana"]


def test_no_step_after_an_ack_a_retry_or_a_stop() -> None:
    first = step(paged_job(), 0, T0)
    acked = ack_command(first.job, "slack:U0BO", T0 + timedelta(minutes=2))
    assert acked.job.page is not None and acked.job.page.acked_by == "slack:U0BO"
    assert acked.history["event"] == "ack" and acked.history["after_steps"] == 1
    ignored = step(acked.job, 1, T0 + timedelta(minutes=5))
    assert dumped(ignored) == [] and ignored.history["why"] == "acknowledged by slack:U0BO"

    retried = resume_command(first.job, "slack:U0BO", False, T0 + timedelta(minutes=3))
    assert retried.job.page is None and dumped(step(retried.job, 1, T0 + timedelta(minutes=5))) == []
    stopped = stop_command(first.job, "slack:U0BO", T0 + timedelta(minutes=3))
    assert stopped.job.state is JobState.STOPPED and dumped(step(stopped.job, 1, T0 + timedelta(minutes=5))) == []


def test_a_page_of_an_earlier_failure_does_not_step_a_new_one() -> None:
    job = paged_job()
    stale = decide(job, PageStep(job_id=job.id, attempt=1, step=0, due=T0), T0, ONCALL)
    assert dumped(stale) == [] and stale.history["why"] == "the page is closed"


@pytest.mark.parametrize(
    "config, problem",
    [
        ({"people": {}, "rota": [["ana"]]}, "not in people"),
        ({"ladder": [{"after_minutes": 0, "notify": ["nobody"]}]}, "use primary, secondary"),
        (
            {"ladder": [{"after_minutes": 5, "notify": ["here"]}, {"after_minutes": 0, "notify": ["here"]}]},
            "in order",
        ),
        ({"people": {"x": {"slack": "not an id"}}}, "String should match"),
        ({"ladder": []}, "at least 1"),
    ],
)
def test_a_bad_on_call_config_is_refused_with_the_reason(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        OnCall.model_validate(config)
