"""Fit the availability models ``deadline-aware-plan`` plans with, on the tuning split of the traces only.

    python bench/spot_model.py [--traces DIR]

Prints ``bench/spot_learned.py``'s two models: the stretches of a job in one zone (each zone of each tuning date
alone) and of a job free to take any zone of its date (all of a date's zones together), over the first 40% of
each tuning date (``policy_traces.SPLITS``), the part the deadline-aware policy's parameters were chosen on too.
The held-out split and the other dates stay unseen. ``tests/test_spot_plan.py`` checks the file against this fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_traces import DEFAULT_TRACES, SPLITS, Date, load_dates

from bench.spot_outlook import Model, Outlook, fit, history_of


def fitted(root: Path) -> tuple[Model, Model]:
    """(one zone, any zone) fitted on the tuning split of the dates under ``root``."""
    one, every = Outlook(), Outlook()
    for date in load_dates(root):
        if not date.tuned_on:
            continue
        last = round(SPLITS["tuning"][1] * date.hours * 3600 / date.gap_seconds)
        up = [[count >= date.nodes for count in zone.counts] for zone in date.zones]
        one = _joined(one, one_zone_stretches(date, last))
        every = _joined(every, history_of(up, 0, last, date.gap_seconds))
    return fit(one), fit(every)


def one_zone_stretches(date: Date, last: int | None = None, first: int = 0) -> Outlook:
    """The stretches of each zone of ``date`` alone, over its ticks ``first`` to ``last`` (None: its trace's end)."""
    out = Outlook()
    for zone in date.zones:
        up = [count >= date.nodes for count in zone.counts]
        out = _joined(out, history_of([up], first, len(up) if last is None else last, date.gap_seconds))
    return out


def _joined(a: Outlook, b: Outlook) -> Outlook:
    return Outlook(a.up + b.up, a.down + b.down, a.moves + b.moves)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = parser.parse_args(argv)
    one, every = fitted(args.traces)
    for name, model in (("ONE_ZONE", one), ("ANY_ZONE", every)):
        print(f"{name} = Model(")
        for field in ("edges_s", "up_end_per_h", "down_end_per_h", "move_share"):
            print(f"    {field}={getattr(model, field)!r},")
        print(")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
