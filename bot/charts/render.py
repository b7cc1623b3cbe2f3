"""A job's chart as a PNG: loss against step, each interruption a vertical line of its own colour, each resume
marked, the spot and on-demand stretches shaded, and the cost so far on a second axis.

matplotlib is imported when a chart is drawn, not when the bot starts (most processes never draw one), with the
Agg backend chosen explicitly: no display, no GUI toolkit, the same pixels everywhere. The layout is fixed (figure
size, the axes' box, the x axis from step 0 to the job's total or furthest step), so :func:`x_pixel` says where a
step is drawn without the figure, which is what a test of the picture (or anyone placing a mark) needs.

The words drawn come from the catalogue in the channel's language when a font for it is installed, else in English
(no CJK font in the image: boxes would be worse than English); the message posted with the chart is always in the
channel's language.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from bot.charts.marks import chart_marks
from bot.charts.series import Point
from bot.chat.catalog import Lang, text
from handlers.jobs import Job

WIDTH_INCHES, HEIGHT_INCHES, DPI = 8.0, 4.5, 100  # 800 × 450 pixels
AXES_BOX = (0.08, 0.13, 0.80, 0.72)  # left, bottom, width, height: fractions of the figure
INTERRUPTION_COLOUR = "#e6007e"  # a magenta used for nothing else in the chart
RESUME_COLOUR = "#2ca02c"
LOSS_COLOUR = "#1f4e9c"
COST_COLOUR = "#7f7f7f"
MARKET_SHADE = {"spot": "#cfe3f7", "on-demand": "#fde2c4"}
DRAWING = threading.Lock()  # one chart at a time, of any kind (matplotlib is not thread-safe)
CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "Microsoft YaHei")


def x_range(job: Job, points: Sequence[Point]) -> tuple[float, float]:
    """The x axis: step 0 to the job's total steps, or the furthest step known when that is further."""
    furthest = max([job.step or 0, job.total_steps or 0, *(point.step for point in points), 1])
    return 0.0, float(furthest)


def x_pixel(step: float, steps: tuple[float, float], width_px: int) -> float:
    """The x pixel (from the image's left edge) at which ``step`` is drawn on a chart of ``width_px`` pixels."""
    left, _bottom, width, _height = AXES_BOX
    low, high = steps
    return (left + width * (step - low) / (high - low)) * width_px


def render_chart(job: Job, points: Sequence[Point], now: datetime, lang: Lang = "en") -> bytes:
    """The PNG of ``job``'s chart from its ``points`` (:class:`bot.charts.series.ChartSeries`), as at ``now``.
    Safe from any thread: one chart is drawn at a time (matplotlib is not thread-safe)."""
    with DRAWING:
        return _render(job, points, now, lang)


def _render(job: Job, points: Sequence[Point], now: datetime, lang: Lang) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=True)  # before pyplot is imported anywhere in this process: no display, ever
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    marks = chart_marks(job, points, now)
    words = drawn_language(lang)
    figure = Figure(figsize=(WIDTH_INCHES, HEIGHT_INCHES), dpi=DPI)
    loss_axes = figure.add_axes(AXES_BOX)
    cost_axes = loss_axes.twinx()
    font: dict[str, Any] = {"family": [*CJK_FAMILIES, "DejaVu Sans"]} if words != "en" else {}
    steps = x_range(job, points)
    loss_axes.set_xlim(*steps)
    for stretch in marks.stretches:
        cost_axes.axvspan(stretch.start, stretch.end, color=MARKET_SHADE[stretch.market], zorder=0, linewidth=0)
    losses = [(point.step, point.loss) for point in points if point.loss is not None and math.isfinite(point.loss)]
    loss_axes.plot([s for s, _ in losses], [loss for _, loss in losses], color=LOSS_COLOUR, linewidth=1.4, zorder=3)
    if losses:
        loss_axes.set_ylim(bottom=min(0.0, *(loss for _, loss in losses)))
    cost_axes.plot([p.step for p in points], marks.costs, color=COST_COLOUR, linewidth=1.0, linestyle="--")
    cost_axes.set_ylim(bottom=0)
    for resume in marks.resumes:
        at_the_bottom = loss_axes.get_xaxis_transform()  # x in steps, y in axes fractions
        loss_axes.plot(
            [resume.step], [0], "^", markersize=9, color=RESUME_COLOUR, zorder=5, transform=at_the_bottom, clip_on=False
        )
    loss_axes.set_zorder(cost_axes.get_zorder() + 1)  # the loss and the marks above the cost line
    loss_axes.patch.set_visible(False)
    for interruption in marks.interruptions:  # last, on top of everything: its colour is what a reader looks for
        loss_axes.axvline(interruption.step, color=INTERRUPTION_COLOUR, linewidth=2.5, zorder=10, antialiased=False)
    loss_axes.set_xlabel(text(words, "chart.step"), **font)
    loss_axes.set_ylabel(text(words, "chart.loss"), color=LOSS_COLOUR, **font)
    cost_axes.set_ylabel(text(words, "chart.cost"), color=COST_COLOUR, **font)
    figure.suptitle(text(words, "chart.title", job=job.id, recipe=job.recipe), **font)
    legend = [
        Line2D([], [], color=LOSS_COLOUR, label=text(words, "chart.loss")),
        Line2D([], [], color=COST_COLOUR, linestyle="--", label=text(words, "chart.cost")),
        Line2D([], [], color=INTERRUPTION_COLOUR, linewidth=2.5, label=text(words, "chart.interrupted")),
        Line2D([], [], color=RESUME_COLOUR, marker="^", linestyle="", label=text(words, "chart.resumed")),
        *(Patch(color=MARKET_SHADE[m], label=text(words, f"market.{m}")) for m in ("spot", "on-demand")),
    ]
    loss_axes.legend(handles=legend, loc="upper right", framealpha=0.9, prop={"size": 7, **font})
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


def drawn_language(lang: Lang) -> Lang:
    """``lang`` when a font that has its characters is installed, else English."""
    if lang == "en":
        return lang
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return lang if installed.intersection(CJK_FAMILIES) else "en"
