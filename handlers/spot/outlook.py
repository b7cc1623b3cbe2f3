"""What the past says of spot to come: the stretches with and without usable spot, and the hazards fitted to them.

A planning policy (:mod:`handlers.spot.plan`) needs a model of availability, not just "is there spot now". The
model is semi-Markov: the lengths of *up* stretches (the job could hold spot in one zone without a break) and of
*down* stretches (no zone had spot) are drawn from distributions fitted here, and the age of the current stretch
is part of the state. Spot stretches are heavy-tailed (a stretch that just began is likely short, one that has
lasted long is likely to last longer): a hazard fitted per log-spaced age bucket captures that decreasing hazard
without any hand-set gate.

The up stretches are those of a job that stays in its zone while it has spot and, when it loses it, takes the zone
whose spot has lasted longest (a move: a new up stretch at once, and a restart for the job); :func:`history_of`
replays that over the past the policy may see. With no history, or little, the fit leans on :data:`PRIOR`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Outlook:
    """The stretches seen in the past (seconds; ``ended`` False: still going when the history stops).

    ``moves``: up stretches that ended with another zone at hand (the job moves and restarts, no wait).
    """

    up: tuple[tuple[float, bool], ...] = ()
    down: tuple[tuple[float, bool], ...] = ()
    moves: int = 0


@dataclass(frozen=True, slots=True)
class Prior:
    """Pseudo-observations the fit starts from: a hazard of ``shape / (age + scale)`` per second (heavy-tailed,
    a decreasing hazard), weighed as ``weight_s`` seconds of exposure in every age bucket."""

    up_shape: float = 1.0
    up_scale_s: float = 2 * 3600.0
    down_shape: float = 1.0
    down_scale_s: float = 1800.0
    move_share: float = 0.5
    weight_s: float = 2 * 3600.0


# Chosen before any measurement, not tuned: up stretches of a few hours, down stretches of under an hour.
PRIOR = Prior()


@dataclass(frozen=True, slots=True)
class Hazards:
    """The fitted model in steps of ``step_s`` seconds: per age bucket (edges in steps), the chance a stretch
    ends within one step; and the share of up stretches that end in a move rather than an outage."""

    edges: tuple[float, ...]
    up_end: tuple[float, ...]
    down_end: tuple[float, ...]
    move_share: float

    def bucket(self, age_steps: float) -> int:
        """The age bucket of a stretch ``age_steps`` old."""
        for index in range(len(self.edges) - 1, -1, -1):
            if age_steps >= self.edges[index]:
                return index
        return 0


# Age bucket edges in planning steps: log-spaced, so old stretches share a bucket and young ones do not.
EDGES = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def fit(outlook: Outlook | None, step_s: float, prior: Prior = PRIOR) -> Hazards:
    """Per-bucket hazards from the stretches (exposure and ends per bucket, plus the prior's pseudo-counts)."""
    outlook = outlook or Outlook()
    up = _bucket_hazards(outlook.up, step_s, prior.up_shape, prior.up_scale_s, prior.weight_s)
    down = _bucket_hazards(outlook.down, step_s, prior.down_shape, prior.down_scale_s, prior.weight_s)
    ended = sum(1 for _, end in outlook.up if end)
    moves = (outlook.moves + 2 * prior.move_share) / (ended + 2)
    return Hazards(EDGES, up, down, min(max(moves, 0.0), 1.0))


def _bucket_hazards(
    stretches: Sequence[tuple[float, bool]], step_s: float, shape: float, scale_s: float, weight_s: float
) -> tuple[float, ...]:
    out = []
    for index, low in enumerate(EDGES):
        high = EDGES[index + 1] if index + 1 < len(EDGES) else math.inf
        lo_s, hi_s = low * step_s, high * step_s
        exposure = weight_s
        middle = lo_s + (min(hi_s, lo_s + 4 * step_s) - lo_s) / 2
        events = weight_s * shape / (middle + scale_s)
        for length, ended in stretches:
            exposure += max(0.0, min(length, hi_s) - lo_s)
            if ended and lo_s < length <= hi_s:
                events += 1
        rate = events / exposure  # per second
        out.append(1 - math.exp(-rate * step_s))
    return tuple(out)


def history_of(available: Sequence[Sequence[bool]], first: int, last: int, gap_s: float) -> Outlook:
    """The up and down stretches of ticks ``first`` to ``last`` (excluded) of these zones' availability, for a job
    that stays in its zone while it has spot and otherwise takes the zone whose spot has lasted longest."""
    up: list[tuple[float, bool]] = []
    down: list[tuple[float, bool]] = []
    moves = 0
    held: int | None = None
    length = 0  # ticks of the current stretch (0: none begun yet)
    ages = [0] * len(available)
    for t in range(max(first, 0), last):
        now = [t < len(zone) and zone[t] for zone in available]
        ages = [age + 1 if is_up else 0 for age, is_up in zip(ages, now, strict=True)]
        if length and (now[held] if held is not None else not any(now)):
            length += 1  # the stretch goes on
            continue
        pick = max((i for i, is_up in enumerate(now) if is_up), key=lambda i: ages[i], default=None)
        if length and held is not None:  # the held zone lost its spot: to another zone, or an outage
            up.append((length * gap_s, True))
            moves += pick is not None
        elif length:  # an outage ends
            down.append((length * gap_s, True))
        held, length = pick, 1
    if length:
        (up if held is not None else down).append((length * gap_s, False))
    return Outlook(tuple(up), tuple(down), moves)
