"""``deadline-aware-plan``, a bench policy: each tick, the action of least *expected* cost to finish by the deadline.

The bench's offline optimum knows the traces; a policy does not. This is the same dynamic program, over the same tick
model as the simulator (a new instance spends the restart's ticks, progress survives a preemption, a held tick costs
its price), with the traces replaced by an availability model (:class:`~bench.spot_outlook.Model`: the hazard of
an up or a down stretch per age bucket, and the share of up stretches that end in a move to another zone). It is
solved backwards over the ticks left, for every (ticks left, work left, what is held and its restart phase,
availability and the age bucket of its stretch), and the policy reads its action from the table:

- a state from which on-demand could no longer finish is priced out (:data:`LATE`), and every stretch may end at
  the next tick, so the plan never takes a risk the deadline cannot absorb;
- nothing in it is tuned: when to leave an outage for on-demand, when to go back to spot and which spot stretch is
  worth a restart all come out of the restart, the slack, the prices and the model.

It lives in the bench, not in the bot: it needs each zone's age (how long it has had spot, or not), which the
simulator gives a policy it tells everything and the live bot does not have. Told the ages the bot could know it was
worse than ``deadline-aware`` at a 30 minute restart (docs/spot-policy.md, "What the bot knows"), so the bot does
not offer it;
``bench/policy_traces.py`` and ``bench/policy_bound.py`` register it beside the simulator's policies
(:data:`BENCH_POLICIES`).

The table is numpy arrays. One table serves every job of the same model, tick, restart and prices, up to its extent.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench.spot_learned import ANY_ZONE, ONE_ZONE
from bench.spot_outlook import Model
from handlers.policy_reasons import WORDING as POLICY_WORDING
from handlers.reasons import Wording
from handlers.spot.rules import (
    SIMULATED_POLICIES,
    Choice,
    Situation,
    SpotPolicy,
    deadline_aware,
    fallback_slack,
    held_zone,
    last_resort,
    on_demand_need_s,
)

PLAN = "deadline-aware-plan"
PlanAction = Literal["wait", "on-demand", "spot"]
ACTIONS: tuple[PlanAction, ...] = ("wait", "on-demand", "spot")
# The price of a state from which the deadline can no longer be kept: finite, so that a chance of zero times it is
# zero, and far above any job's cost.
LATE = 1e12
# The largest table solved, in entries (a byte each): the bench's 36 h deadline in 195 s ticks with a 30 min restart
# is 124 million. A finer trace or a longer job would take minutes and gigabytes: the policy decides by its rules.
MOST_ENTRIES = 160_000_000
# Tables kept: a job in one zone and one in several, each as large as the largest job asked about.
KEPT = 2


@dataclass(frozen=True, slots=True)
class Key:
    """What a table depends on besides its extent: the model, the tick, the restart in ticks, the tick's prices."""

    model: Model
    tick_s: float
    restart_ticks: int
    spot_cost: float
    on_demand_cost: float


class Table:
    """The actions of one plan: ``actions[ticks left, holding, availability, work left]`` (0 wait, 1 on-demand,
    2 spot). ``holding``: 0 nothing, 1 + phase on-demand, 1 + phases + phase spot, the phase being the restart ticks
    the instance still has to spend; ``availability``: the up age buckets, then the down ones."""

    def __init__(self, key: Key, ticks: int, work: int) -> None:
        self.key, self.ticks, self.work = key, ticks, work
        self.phases = _phases(key)
        self.buckets = len(key.model.edges_s)
        self.actions = _solve(key, ticks, work, self.phases)

    def action(self, ticks_left: int, work_left: int, holding: int, up: bool, age_s: float) -> PlanAction:
        state = self.key.model.bucket(age_s) + (0 if up else self.buckets)
        return ACTIONS[int(self.actions[ticks_left, holding, state, work_left])]


def transitions(model: Model, tick_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over one tick, per availability state: the chances of going on (``[state, next]``: the same stretch, one
    bucket older or not; an outage ending in spot), of an up stretch ending in a move, and in an outage.

    This chain is the model the plan is optimal on; ``bench/policy_bound.py`` draws availability from it."""
    buckets = len(model.edges_s)
    going = np.zeros((2 * buckets, 2 * buckets))
    move, down = np.zeros(2 * buckets), np.zeros(2 * buckets)
    for index, low in enumerate(model.edges_s):
        width = model.edges_s[index + 1] - low if index + 1 < buckets else math.inf
        older = min(tick_s / width, 1.0)
        following = min(index + 1, buckets - 1)
        for up, rates in ((True, model.up_end_per_h), (False, model.down_end_per_h)):
            state, base = (index, 0) if up else (buckets + index, buckets)
            end = min(max(1 - math.exp(-rates[index] * tick_s / 3600), 1e-6), 1 - 1e-6)
            going[state, base + following] += (1 - end) * older
            going[state, base + index] += (1 - end) * (1 - older)
            if up:
                move[state], down[state] = end * model.move_share, end * (1 - model.move_share)
            else:
                going[state, 0] += end  # the outage ends: spot somewhere, a fresh stretch
    return going, move, down


def _solve(key: Key, ticks: int, work: int, phases: int) -> np.ndarray:
    going, move, down = transitions(key.model, key.tick_s)
    buckets = len(key.model.edges_s)
    anyway = going.copy()  # for what is not spot: a move is spot again, a fresh stretch; an outage is an outage
    anyway[:, 0] += move
    anyway[:, buckets] += down
    restart = key.restart_ticks
    on_demand = [1 + phase for phase in range(phases)]
    spot = [1 + phases + phase for phase in range(phases)]
    up = np.zeros(2 * buckets, bool)
    up[:buckets] = True
    value = np.full((1 + 2 * phases, 2 * buckets, work + 1), LATE)  # no ticks left: only a finished job is free
    value[:, :, 0] = 0.0
    actions = np.zeros((ticks + 1, 1 + 2 * phases, 2 * buckets, work + 1), np.int8)
    for left in range(1, ticks + 1):
        after = np.einsum("st,htw->hsw", anyway, value)  # the expected value at the next tick, holding stays
        # Spot held on: the stretch goes on, or the instance is lost (holding nothing, at a move or an outage).
        after_spot = np.einsum("st,htw->hsw", going, value[spot])
        after_spot += move[None, :, None] * value[0, 0][None, None, :] + down[None, :, None] * value[0, buckets]
        held = np.concatenate([after[: 1 + phases], after_spot])

        new_on_demand = _running(held, on_demand, restart, key.on_demand_cost)
        new_spot = np.where(up[:, None], _running(held, spot, restart, key.spot_cost), LATE)
        # Every holding's three options at once ([action, holding, state, work]): waiting is the same from any
        # holding; an instance already held goes on in its phase, any other holding starts a new one.
        options = np.empty((3, *value.shape))
        options[0] = after[0]
        options[1] = new_on_demand
        options[2] = new_spot
        for phase, holding in enumerate(on_demand):
            options[1, holding] = _running(held, on_demand, phase, key.on_demand_cost)
        for phase, holding in enumerate(spot):
            options[2, holding] = np.where(up[:, None], _running(held, spot, phase, key.spot_cost), LATE)
        # The first of equals: wait, then on-demand, then spot (argmin's order, without its slow reduction over
        # the first axis).
        cheaper = np.minimum(options[1], options[2])
        actions[left] = np.where(options[0] <= cheaper, 0, np.where(options[1] <= options[2], 1, 2))
        value = np.minimum(options[0], cheaper)
        value[:, :, 0] = 0.0
    return actions


def _running(held: np.ndarray, instance: list[int], phase: int, price: float) -> np.ndarray:
    """The value of this tick on an instance in ``phase`` (restart ticks still to spend; a new one: the whole
    restart), then the plan: ``held`` is the next tick's expected value per holding."""
    out = np.full(held.shape[1:], LATE)
    if phase > 0:
        out[:] = held[instance[phase - 1]]
    else:
        out[:, 1:] = held[instance[0]][:, :-1]  # a tick of progress
    return np.minimum(out + price, LATE)


_TABLES: OrderedDict[Key, Table] = OrderedDict()


def _phases(key: Key) -> int:
    """The restart phases an instance goes through (one, running, where a new instance starts at once)."""
    return max(key.restart_ticks, 1)


def too_large(key: Key, ticks: int, work: int) -> bool:
    """Whether the table of ``key`` for ``ticks`` left and ``work`` ticks of work would pass :data:`MOST_ENTRIES`."""
    holdings = 1 + 2 * _phases(key)
    return (ticks + 1) * holdings * 2 * len(key.model.edges_s) * (work + 1) > MOST_ENTRIES


def table_for(key: Key, ticks: int, work: int) -> Table | None:
    """The table of ``key`` with room for ``ticks`` left and ``work`` ticks of work (solved once and kept, grown to
    cover every job asked about where that fits); None where even this job's would be :func:`too_large`."""
    table = _TABLES.get(key)
    if table is None or table.ticks < ticks or table.work < work:
        grown = (max(ticks, table.ticks if table else 0), max(work, table.work if table else 0))
        extent = grown if not too_large(key, *grown) else (ticks, work)
        if too_large(key, *extent):
            return None
        table = Table(key, *extent)
        _TABLES[key] = table
        while len(_TABLES) > KEPT:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return table


WORDING = Wording(
    {
        "bench.plan.on-demand": (
            "staying on on-demand: spot as seen so far would cost more in restarts than it saves "
            "({work_h:g} h of work left, {left_h:g} h to the deadline)"
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Planned:
    """``deadline-aware-plan``: each tick, the action of least expected cost to finish by the deadline, read from
    the table of the plan over a model of spot availability.

    The model is :mod:`bench.spot_learned`'s (fitted on the tuning split of the bundled traces): a job in one
    zone plans with the stretches of one zone, a job with several with those of a job free to take any. Spot goes
    to the held zone while it has spot, else to the zone whose spot has lasted longest. It needs each zone's age
    (how long it has had spot, or not), which the simulator gives where it tells the policy everything; where a
    zone's age is unknown (a ``live`` run), with a budget, without a deadline, or where the table would be too large
    to solve (ticks much finer than the job: :func:`too_large`), ``deadline-aware`` decides.
    """

    fallback: SpotPolicy = deadline_aware

    def __call__(self, s: Situation) -> Choice:
        ages = [zone.age_s for zone in s.zones]
        if s.time_left_s is None or s.budget is not None or not ages or None in ages:
            return self.fallback(s)
        if on_demand_need_s(s) > s.time_left_s:
            return last_resort(s)
        open_zones = [zone for zone in s.zones if zone.available]
        zone = held_zone(s) or max(open_zones, key=lambda z: z.age_s or 0.0, default=None)
        age = zone.age_s if zone is not None else min(z.age_s or 0.0 for z in s.zones)
        model = ONE_ZONE if len(s.zones) == 1 else ANY_ZONE
        action = plan_action(s, model, zone is not None, age or 0.0)
        if action is None:  # ticks far finer than the job: a table of billions of entries
            return self.fallback(s)
        if action == "spot" and zone is not None:
            slack = _hours(fallback_slack(s, "spot"))
            return Choice("spot", zone.name, POLICY_WORDING("spot-policy.spot", zone=zone.name, slack_h=slack))
        if action == "wait":
            return Choice("wait", None, POLICY_WORDING("spot-policy.wait", slack_h=_hours(fallback_slack(s, None))))
        if s.holding.market == "on-demand":
            return Choice("on-demand", None, WORDING("bench.plan.on-demand", **_values(s)))
        return Choice("on-demand", None, POLICY_WORDING("spot-policy.on-demand.deadline", **_values(s)))


def plan_action(s: Situation, model: Model, up: bool, age_s: float) -> PlanAction | None:
    """The plan's action for ``s`` over ``model``, with spot at hand (``up``) or not, in a stretch ``age_s`` old;
    None where its table would be too large. ``s`` has a deadline the work can still meet on on-demand."""
    assert s.time_left_s is not None
    tick = s.period_s  # whole ticks, each rounded the safe way: the time left down, what it must hold up
    ticks_left, work_left = math.floor(s.time_left_s / tick + 1e-9), math.ceil(s.work_left_s / tick - 1e-9)
    key = Key(
        model,
        tick,
        math.ceil(s.restart_s / tick - 1e-9),
        s.spot_price * tick / 3600,
        s.on_demand_price * tick / 3600,
    )
    table = table_for(key, ticks_left, work_left)
    if table is None:
        return None
    phases, phase = table.phases, min(math.ceil(s.holding.starting_s / tick - 1e-9), table.phases - 1)
    holding = 0
    if s.holding.market == "on-demand":
        holding = 1 + phase
    elif held_zone(s) is not None:
        holding = 1 + phases + phase
    return table.action(ticks_left, work_left, holding, up, age_s)


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 1)


def _values(s: Situation) -> dict[str, float]:
    return {"work_h": _hours(s.work_left_s), "left_h": _hours(s.time_left_s or 0.0)}


# The bot's policies and the plan: what the bench scripts that evaluate the plan offer.
BENCH_POLICIES: dict[str, SpotPolicy] = {**SIMULATED_POLICIES, PLAN: Planned()}
