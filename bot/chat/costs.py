"""``/finetune costs`` in chat: the report in words (:func:`costs_text`), and its bar chart (:func:`costs_png`).

The words: the report's total, then each group (team, user, recipe), then what each zone billed (a zone's name
says its region), in the channel's language. Names are shown as they are stored (``slack:U0…``), never as mentions:
a report names people, it does not call them.

The chart: per team, what was paid beside what on-demand would have cost (PNG bytes). Drawn by the chat outbox when
it delivers a :class:`~handlers.messages.CostsChart` (``/finetune costs`` asked in a channel), and posted there with
the report's words through the platform's image path (Slack's ``files.getUploadURLExternal`` flow, DingTalk's media
upload). matplotlib is imported by :func:`costs_png`, lazily, with the Agg backend (no display), so nothing else in
the bot pays for it.
"""

from __future__ import annotations

import io
from typing import Any

from bot.chat.catalog import Lang, text
from handlers.cost_report import NO_TEAM, WINDOWS, CostReport, Spend

PAID_COLOUR = "#d62728"
ON_DEMAND_COLOUR = "#7f7f7f"


def costs_text(report: CostReport, lang: Lang) -> str:
    scope = (
        text(lang, "costs.scope.all")
        if report.teams is None
        else text(lang, "costs.scope.teams", teams=", ".join(report.teams))
    )
    title = text(
        lang,
        "costs.title",
        days=WINDOWS[report.window].days,
        start=report.start,
        end=report.end,
        scope=scope,
        jobs=report.total.jobs,
    )
    if not report.jobs:
        return f"{title}\n{text(lang, 'costs.none')}"
    lines = [title, _line(lang, text(lang, "costs.total"), report.total)]
    no_team = text(lang, "costs.no-team")
    for heading, groups in (
        ("costs.by-team", {(no_team if name == NO_TEAM else name): spend for name, spend in report.by_team.items()}),
        ("costs.by-user", report.by_user),
        ("costs.by-recipe", report.by_recipe),
    ):
        lines.append(text(lang, heading))
        lines += [f"  {_line(lang, name, spend)}" for name, spend in groups.items()]
    if report.by_zone:  # where the money went: each zone names its region (us-west-2b)
        lines.append(text(lang, "costs.by-zone"))
        lines += [
            "  " + text(lang, "costs.zone-line", zone=zone, paid=spend.paid, hours=spend.hours, jobs=spend.jobs)
            for zone, spend in report.by_zone.items()
        ]
    return "\n".join(lines)


def _line(lang: Lang, name: str, spend: Spend) -> str:
    savings = spend.savings
    saved = (
        text(lang, "costs.saved-unknown")
        if savings is None
        else text(lang, "costs.saved", saved=spend.saved, savings=savings)
    )
    egress = text(lang, "costs.egress", egress=spend.egress) if spend.egress > 0 else ""
    return text(
        lang,
        "costs.line",
        name=name,
        paid=spend.paid,
        egress=egress,
        on_demand=spend.on_demand,
        saved=saved,
        jobs=spend.jobs,
        steps_lost=spend.steps_lost,
        restart_hours=spend.restart_hours,
    )


def costs_png(report: CostReport, lang: Lang = "en") -> bytes:
    """Two bars per team (paid, on-demand), the biggest spender first; a PNG of 800×400 pixels. Its words are in
    ``lang`` when a font for it is installed, else in English (as a job's chart). Safe from any thread: drawn under
    the lock every chart takes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from bot.charts.render import CJK_FAMILIES, DRAWING, drawn_language

    words = drawn_language(lang)
    font: dict[str, Any] = {"family": [*CJK_FAMILIES, "DejaVu Sans"]} if words != "en" else {}
    teams = list(report.by_team)
    names = [text(words, "costs.no-team") if team == NO_TEAM else team for team in teams]
    with DRAWING:
        figure = Figure(figsize=(8, 4), dpi=100)
        axes = figure.add_subplot()
        positions = range(len(teams))
        paid = [report.by_team[team].paid for team in teams]
        on_demand = [report.by_team[team].on_demand for team in teams]
        axes.bar([p - 0.2 for p in positions], paid, 0.4, color=PAID_COLOUR, label=text(words, "costs.chart.paid"))
        axes.bar(
            [p + 0.2 for p in positions],
            on_demand,
            0.4,
            color=ON_DEMAND_COLOUR,
            label=text(words, "costs.chart.on-demand"),
        )
        axes.set_xticks(list(positions), names, **font)
        axes.set_ylabel("USD")
        title = text(words, "costs.chart-title", days=WINDOWS[report.window].days)
        axes.set_title(f"{title}\n{report.start:%Y-%m-%d %H:%M} → {report.end:%Y-%m-%d %H:%M} UTC", **font)
        axes.legend(prop=font)
        out = io.BytesIO()
        figure.savefig(out, format="png")
        return out.getvalue()
