"""``/finetune costs`` in words: the report's total, then each group (team, user, recipe), in the channel's language.

Names are shown as they are stored (``slack:U0…``), never as mentions: a report names people, it does not call them.
"""

from __future__ import annotations

from bot.chat import catalog
from bot.chat.catalog import Lang
from handlers.cost_report import NO_TEAM, WINDOWS, CostReport, Spend


def costs_text(report: CostReport, lang: Lang) -> str:
    scope = (
        catalog.text(lang, "costs.scope.all")
        if report.teams is None
        else catalog.text(lang, "costs.scope.teams", teams=", ".join(report.teams))
    )
    title = catalog.text(
        lang,
        "costs.title",
        days=WINDOWS[report.window].days,
        start=report.start,
        end=report.end,
        scope=scope,
        jobs=report.total.jobs,
    )
    if not report.jobs:
        return f"{title}\n{catalog.text(lang, 'costs.none')}"
    lines = [title, _line(lang, catalog.text(lang, "costs.total"), report.total)]
    no_team = catalog.text(lang, "costs.no-team")
    for heading, groups in (
        ("costs.by-team", {(no_team if name == NO_TEAM else name): spend for name, spend in report.by_team.items()}),
        ("costs.by-user", report.by_user),
        ("costs.by-recipe", report.by_recipe),
    ):
        lines.append(catalog.text(lang, heading))
        lines += [f"  {_line(lang, name, spend)}" for name, spend in groups.items()]
    return "\n".join(lines)


def _line(lang: Lang, name: str, spend: Spend) -> str:
    savings = spend.savings
    saved = (
        catalog.text(lang, "costs.saved-unknown")
        if savings is None
        else catalog.text(lang, "costs.saved", saved=spend.saved, savings=savings)
    )
    return catalog.text(
        lang,
        "costs.line",
        name=name,
        paid=spend.paid,
        on_demand=spend.on_demand,
        saved=saved,
        jobs=spend.jobs,
        steps_lost=spend.steps_lost,
        restart_hours=spend.restart_hours,
    )
