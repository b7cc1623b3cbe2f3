"""What the past says of spot to come: the stretches with and without usable spot, and the hazards fitted to them.

A planning policy (:mod:`bench.spot_plan`) needs a model of availability, not just "is there spot now". The
model is semi-Markov: the lengths of *up* stretches (the job could hold spot in one zone without a break) and of
*down* stretches (no zone had spot) are drawn from distributions fitted here, and the age of the current stretch
is part of the state. Spot stretches are heavy-tailed (a stretch that just began is likely short, one that has
lasted long is likely to last longer): a hazard fitted per log-spaced age bucket captures that decreasing hazard
without any hand-set gate.

The up stretches are those of a job that stays in its zone while it has spot and, when it loses it, takes the zone
whose spot has lasted longest (a move: a new up stretch at once, and a restart for the job); :func:`history_of`
replays that over a trace; :func:`fit` turns the stretches into a :class:`Model` (``bench/spot_model.py`` fits the
models :mod:`bench.spot_learned` holds). Where a bucket saw little, the fit leans on a prior.
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
class Model:
    """Spot availability as stretches: per age bucket (lower edges ``edges_s``, seconds), the rate per hour at which
    an up stretch (spot held in one zone without a break) or a down stretch (no zone has spot) of that age ends; and
    the share of up stretches that end in a move to another zone rather than an outage."""

    edges_s: tuple[float, ...]
    up_end_per_h: tuple[float, ...]
    down_end_per_h: tuple[float, ...]
    move_share: float

    def bucket(self, age_s: float) -> int:
        """The age bucket of a stretch ``age_s`` old."""
        for index in range(len(self.edges_s) - 1, -1, -1):
            if age_s >= self.edges_s[index]:
                return index
        return 0


# Age bucket edges: doubling from five minutes to about a day, so young stretches (likely short) and old ones (likely
# to go on) do not share a rate.
EDGES_S = (0.0, 300.0, 600.0, 1200.0, 2400.0, 4800.0, 9600.0, 19200.0, 38400.0, 76800.0)
# What the fit starts from in every bucket, chosen before any measurement: an hour of exposure at the rate of up
# stretches of ten hours and down stretches of one (so a bucket with little seen stays near them).
PRIOR_HOURS, UP_MEAN_H, DOWN_MEAN_H = 1.0, 10.0, 1.0


def fit(outlook: Outlook) -> Model:
    """Per bucket: (stretches that ended in it + the prior's) / (hours spent in it + the prior's)."""
    ended = sum(1 for _, end in outlook.up if end)
    return Model(
        EDGES_S,
        _rates(outlook.up, UP_MEAN_H),
        _rates(outlook.down, DOWN_MEAN_H),
        round((outlook.moves + 1) / (ended + 2), 6),
    )


def _rates(stretches: Sequence[tuple[float, bool]], mean_h: float) -> tuple[float, ...]:
    out = []
    for index, low in enumerate(EDGES_S):
        high = EDGES_S[index + 1] if index + 1 < len(EDGES_S) else math.inf
        hours, ends = PRIOR_HOURS, PRIOR_HOURS / mean_h
        for length, ended in stretches:
            hours += max(0.0, min(length, high) - low) / 3600
            ends += ended and low < length <= high
        out.append(round(ends / hours, 6))
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
