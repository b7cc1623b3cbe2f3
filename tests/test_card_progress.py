"""The card's progress bar and ETA (from the step rate the current attempt measured), in both languages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.chat.catalog import text
from bot.chat.render import card, chart_caption, progress_bar
from handlers.jobs import Attempt, Job, JobState

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


def running(step: int, total: int | None, minutes: float, resumed_from: int | None = None) -> Job:
    attempt = Attempt(
        number=1, instance_id="i-1", started_at=NOW - timedelta(minutes=minutes), resumed_from_step=resumed_from
    )
    return Job(
        id="ft-bar1",
        recipe="tiny",
        requested_by="slack:U0ANA",
        state=JobState.RUNNING,
        attempts=[attempt],
        step=step,
        total_steps=total,
    )


def field(job: Job, lang: str, label: str) -> str | None:
    return dict(card(job, NOW, lang).fields).get(text(lang, label))  # type: ignore[arg-type]


def test_the_bar_fills_a_cell_per_tenth_reached_and_is_full_only_at_the_end() -> None:
    assert progress_bar(0.0) == "▱" * 10
    assert progress_bar(0.45) == "▰" * 4 + "▱" * 6
    assert progress_bar(0.999) == "▰" * 9 + "▱"
    assert progress_bar(1.0) == progress_bar(1.5) == "▰" * 10


def test_the_step_field_shows_the_bar_and_the_eta_comes_from_the_measured_rate_in_both_languages() -> None:
    job = running(step=40, total=100, minutes=18, resumed_from=15)  # 25 steps in 18 min: 60 more take 43.2 min
    assert field(job, "en", "label.step") == "▰▰▰▰▱▱▱▱▱▱ 40% · 40/100"
    assert field(job, "zh-CN", "label.step") == "▰▰▰▰▱▱▱▱▱▱ 40% · 40/100"
    assert (field(job, "en", "label.eta"), field(job, "zh-CN", "label.eta")) == ("43 min", "43 分钟")
    slow = running(step=10, total=1000, minutes=30)  # 3 min a step: 990 more take 49.5 h
    assert (field(slow, "en", "label.eta"), field(slow, "zh-CN", "label.eta")) == ("49.5 h", "49.5 小时")
    assert field(running(step=10, total=1000, minutes=1), "en", "label.eta") == "99 min"  # under 2 h: minutes


def test_without_a_total_there_is_no_bar_and_no_eta() -> None:
    job = running(step=40, total=None, minutes=18)
    assert field(job, "en", "label.step") == "40" and field(job, "en", "label.eta") is None


def test_the_chart_caption_of_an_ended_job_states_what_the_card_states_in_both_languages() -> None:
    # A tiny job's 30 s at $0.30/h: $0.0025, which two decimals would show as "$0.00".
    attempt = Attempt(
        number=1,
        instance_id="i-1",
        price_per_hour=0.30,
        launched_at=NOW - timedelta(seconds=30),
        started_at=NOW - timedelta(seconds=25),
        ended_at=NOW,
    )
    job = Job(
        id="ft-cap1",
        recipe="tiny",
        requested_by="slack:U0ANA",
        state=JobState.SUCCEEDED,
        attempts=[attempt],
        step=30,
        total_steps=30,
    )
    for lang in ("en", "zh-CN"):
        paid = field(job, lang, "label.cost")
        assert paid is not None and paid.startswith("$0.0025"), paid
        assert "$0.0025" in chart_caption(job, NOW + timedelta(hours=1), lang)  # ended: later is the same
    assert chart_caption(job, NOW, "en") == "📈 ft-cap1: loss and cost, step 30/30, 0 interruption(s), $0.0025 in all"
