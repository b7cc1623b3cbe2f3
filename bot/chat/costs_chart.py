"""The bar chart of a costs report: per team, what was paid beside what on-demand would have cost (PNG bytes).

Drawn by the chat outbox when it delivers a :class:`~handlers.messages.CostsChart` (``/finetune costs`` asked in a
channel), and posted there with the report's words through the platform's image path (Slack's
``files.getUploadURLExternal`` flow, DingTalk's media upload). matplotlib is imported here, lazily, with the Agg
backend (no display), so nothing else in the bot pays for it.
"""

from __future__ import annotations

import io

from handlers.cost_report import CostReport

PAID_COLOUR = "#d62728"
ON_DEMAND_COLOUR = "#7f7f7f"


def costs_png(report: CostReport) -> bytes:
    """Two bars per team (paid, on-demand), the biggest spender first; a PNG of 800×400 pixels."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    teams = list(report.by_team)
    figure = Figure(figsize=(8, 4), dpi=100)
    axes = figure.add_subplot()
    positions = range(len(teams))
    paid = [report.by_team[team].paid for team in teams]
    axes.bar([p - 0.2 for p in positions], paid, 0.4, color=PAID_COLOUR, label="paid")
    axes.bar(
        [p + 0.2 for p in positions],
        [report.by_team[t].on_demand for t in teams],
        0.4,
        color=ON_DEMAND_COLOUR,
        label="on-demand",
    )
    axes.set_xticks(list(positions), teams)
    axes.set_ylabel("USD")
    axes.set_title(f"{report.window}: {report.start:%Y-%m-%d} → {report.end:%Y-%m-%d}")
    axes.legend()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
