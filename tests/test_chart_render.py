"""The chart's picture: the interruption line in its colour at its step's pixel (read back from the PNG, no golden
file), and the marks derived from the job's attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.charts.marks import chart_marks
from bot.charts.render import (
    AXES_BOX,
    HEIGHT_INCHES,
    INTERRUPTION_COLOUR,
    RESUME_COLOUR,
    render_chart,
    x_pixel,
    x_range,
)
from bot.charts.series import Point
from handlers.jobs import Attempt, Job, JobState
from tests.chart_pixels import colour_rows, decoded

T0 = datetime(2026, 5, 1, 12, tzinfo=UTC)


def minutes(count: float) -> datetime:
    return T0 + timedelta(minutes=count)


def finished_job(interrupted_at: int = 400, resumed_from: int = 350, total: int = 1000) -> tuple[Job, list[Point]]:
    """Attempt 1 on spot to ``interrupted_at`` (checkpoint at ``resumed_from``), attempt 2 on on-demand to the end."""
    first = Attempt(
        number=1,
        market="spot",
        instance_id="i-1",
        price_per_hour=1.2,
        launched_at=T0,
        started_at=minutes(1),
        ended_at=minutes(41),
        reached_step=interrupted_at,
        lost_steps=interrupted_at - resumed_from,
    )
    second = Attempt(
        number=2,
        market="on-demand",
        instance_id="i-2",
        price_per_hour=4.0,
        launched_at=minutes(42),
        started_at=minutes(44),
        ended_at=minutes(110),
        resumed_from_step=resumed_from,
    )
    job = Job(
        id="ft-chart1",
        recipe="tiny",
        requested_by="slack:U0ANA",
        state=JobState.SUCCEEDED,
        attempts=[first, second],
        step=total,
        total_steps=total,
        interruptions=1,
    )
    points = [Point(s, 3.0 / (1 + s / 100), minutes(1 + s / 10), 1) for s in range(10, interrupted_at + 1, 10)]
    points += [
        Point(s, 3.0 / (1 + s / 100), minutes(44 + (s - resumed_from) / 10), 2)
        for s in range(interrupted_at + 10, total + 1, 10)
    ]
    return job, points


def test_the_marks_come_from_the_attempts_and_the_cost_grows_with_time() -> None:
    job, points = finished_job()
    marks = chart_marks(job, points, minutes(200))
    assert [(m.step, m.attempt) for m in marks.interruptions] == [(400, 1)]
    assert [(m.step, m.attempt) for m in marks.resumes] == [(350, 2)]
    assert [(s.start, s.end, s.market) for s in marks.stretches] == [(0, 400, "spot"), (350, 1000, "on-demand")]
    assert marks.costs == sorted(marks.costs) and marks.costs[0] > 0
    assert abs(marks.costs[-1] - (1.2 * 41 / 60 + 4.0 * (points[-1].at - minutes(42)).total_seconds() / 3600)) < 1e-9


def test_the_interruption_line_is_drawn_in_its_colour_at_its_step_and_nowhere_else() -> None:
    job, points = finished_job(interrupted_at=400)
    png = render_chart(job, points, minutes(200))
    pixels = decoded(png)
    height, width, _ = pixels.shape
    assert (width, height) == (800, round(HEIGHT_INCHES * 100))
    axes_rows = AXES_BOX[3] * height
    at = x_pixel(400, x_range(job, points), width)
    assert colour_rows(pixels, at) >= 0.9 * axes_rows  # the line spans the plot, top to bottom
    for elsewhere in (100, 700, 950):  # no other step has it
        assert colour_rows(pixels, x_pixel(elsewhere, x_range(job, points), width), slack=3) < 20  # (the legend's)
    assert colour_rows(pixels, x_pixel(350, x_range(job, points), width), colour=RESUME_COLOUR, slack=4) > 0


def test_a_job_never_interrupted_has_no_such_line_and_a_chinese_chart_renders_too() -> None:
    job, points = finished_job()
    once = job.model_copy(update={"attempts": job.attempts[1:], "interruptions": 0})
    pixels = decoded(render_chart(once, [p for p in points if p.attempt == 2], minutes(200), "zh-CN"))
    width = pixels.shape[1]
    assert max(colour_rows(pixels, x, INTERRUPTION_COLOUR, slack=0) for x in range(width)) < 20  # the legend only


def test_a_job_without_points_yet_still_draws() -> None:
    job = Job(id="ft-empty1", recipe="tiny", requested_by="slack:U0ANA")
    assert render_chart(job, [], T0).startswith(b"\x89PNG")
    diverged = [Point(1, 2.0, T0, 1), Point(2, float("nan"), T0, 1), Point(3, float("inf"), T0, 1)]
    assert render_chart(job, diverged, T0).startswith(b"\x89PNG")  # a loss that blew up is left out, not fatal
