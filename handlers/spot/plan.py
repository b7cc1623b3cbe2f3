"""Planning against a model of availability: the offline optimum's dynamic program, solved in expectation.

The bench's offline optimum knows the traces; a policy does not. Here the traces are replaced by the fitted
semi-Markov model of :mod:`handlers.spot.outlook` and the same program is solved backwards over the time left,
for the least *expected* cost of finishing by the deadline:

- time in planning steps of ``u`` ticks (``u`` at least the restart, and the deadline in at most
  :data:`STEPS` steps), the state is (steps left, slack in steps: time left minus work left, what the job holds:
  nothing / on-demand / spot, availability: up or down with the age bucket of its stretch);
- actions: wait, on-demand, spot (while up); a new instance spends the restart ``R / u`` of its first step; a
  spot stretch that ends within a step loses the instance half-way through it;
- a state from which on-demand could no longer finish is infinitely costly, so the plan never takes a risk the
  deadline cannot absorb (the policy checks the exact fallback on top, tick by tick).

Nothing in it is tuned: the switching thresholds come out of the restart, the slack, the prices and the fitted
hazards. Plain Python (the handlers stay light); a plan is solved once per model and kept (:func:`plan_for`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from handlers.spot.outlook import Hazards, Outlook, fit

NONE, ON_DEMAND, SPOT = 0, 1, 2
HOLDINGS = (NONE, ON_DEMAND, SPOT)
INF = math.inf
# The deadline in at most this many planning steps (more: finer, slower).
STEPS = 48


@dataclass(frozen=True, slots=True)
class Key:
    """What a plan depends on: the model, the step, the restart and the prices (per step), the table's extent."""

    outlook: Outlook | None
    step_ticks: int
    restart_steps: float
    spot_cost: float
    on_demand_cost: float
    steps: int
    slack: int


class Plan:
    """The expected-cost table of one model, and the actions' values at any (fractional) state."""

    def __init__(self, key: Key, hazards: Hazards) -> None:
        self.key = key
        self.hazards = hazards
        buckets = len(hazards.edges)
        self.buckets = buckets
        self.states = 2 * buckets  # up 0..B-1, down B..2B-1
        self.moves = self._moves()
        self.table: list[list[list[float]]] = []  # [steps left][slack][holding * states + availability]
        self._solve()

    # -- the model's one-step moves ---------------------------------------------------------------------------

    def _moves(self) -> list[list[tuple[float, int, bool]]]:
        """Per availability state: (probability, next state, the up stretch ended) over one step."""
        h, b = self.hazards, self.buckets
        out: list[list[tuple[float, int, bool]]] = []
        for up in (True, False):
            for index in range(b):
                width = (h.edges[index + 1] - h.edges[index]) if index + 1 < b else INF
                older = 1 / width if width != INF else 0.0
                nxt = min(index + 1, b - 1)
                end = h.up_end[index] if up else h.down_end[index]
                base = 0 if up else b
                moves = [((1 - end) * older, base + nxt, False), ((1 - end) * (1 - older), base + index, False)]
                if up:
                    moves += [(end * h.move_share, 0, True), (end * (1 - h.move_share), b, True)]
                else:
                    moves += [(end, 0, False)]
                out.append([m for m in moves if m[0] > 0])
        return out

    # -- the table ---------------------------------------------------------------------------------------------

    def _solve(self) -> None:
        key, n = self.key, self.states
        done = [0.0] * (3 * n)
        self.table.append([list(done) for _ in range(key.slack + 1)])  # no time left: only a finished job is here
        for steps in range(1, key.steps + 1):
            row = []
            for slack in range(key.slack + 1):
                if slack >= steps:  # no work left
                    row.append(list(done))
                    continue
                values = []
                for holding in HOLDINGS:
                    for state in range(n):
                        values.append(min(self.values(steps, slack, holding, state, 0.0)))
                row.append(values)
            self.table.append(row)

    def value(self, steps: float, slack: float, holding: int, state: int) -> float:
        """The table's expected cost at a fractional state (linear between grid points; infinite where on-demand
        could not finish)."""
        need = 0.0 if holding == ON_DEMAND else self.key.restart_steps
        if slack < need - 1e-9 or steps < 0:
            return INF
        if slack >= steps:
            return 0.0
        steps = min(steps, float(self.key.steps))
        slack = min(slack, float(self.key.slack))
        low_t = int(steps)
        frac_t = steps - low_t
        at = self._at_steps(low_t, slack, holding, state)
        if frac_t > 1e-9 and low_t + 1 < len(self.table):  # (while solving: the rows so far)
            upper = self._at_steps(low_t + 1, slack, holding, state)
            at = _mix(at, upper, frac_t)
        return at

    def _at_steps(self, steps: int, slack: float, holding: int, state: int) -> float:
        if slack >= steps:
            return 0.0
        low = int(slack)
        frac = slack - low
        row = self.table[steps]
        index = holding * self.states + state
        at = row[low][index]
        if frac > 1e-9 and low + 1 < len(row):
            at = _mix(at, row[low + 1][index], frac)
        return at

    def values(self, steps: float, slack: float, holding: int, state: int, starting: float) -> tuple[float, ...]:
        """Expected costs of (wait, on-demand, spot) for one step from this state, then the plan.

        ``starting``: restart steps the held instance still has to spend (0: it is running).
        """
        key = self.key
        work = steps - slack
        up = state < self.buckets
        moves = self.moves[state]
        wait = sum(p * self.value(steps - 1, slack - 1, NONE, nxt) for p, nxt, _ in moves)
        start = starting if holding == ON_DEMAND else key.restart_steps
        on_demand = self._run(work, start, key.on_demand_cost)
        if on_demand is None:
            on_demand = key.on_demand_cost + sum(
                p * self.value(steps - 1, slack - start, ON_DEMAND, nxt) for p, nxt, _ in moves
            )
        spot = INF
        if up:
            start = starting if holding == SPOT else key.restart_steps
            finished = self._run(work, start, key.spot_cost)
            spot = 0.0
            for p, nxt, lost in moves:
                if not lost:
                    spot += p * (
                        finished
                        if finished is not None
                        else key.spot_cost + self.value(steps - 1, slack - start, SPOT, nxt)
                    )
                    continue
                made = max(0.0, 0.5 - start)  # lost half-way through the step, where the plan decides afresh
                if made >= work:
                    spot += p * key.spot_cost * (start + work)
                else:
                    spot += p * (key.spot_cost / 2 + self.value(steps - 0.5, slack - 0.5 + made, NONE, nxt))
        return (wait, on_demand, spot)

    def now(
        self, steps: float, slack: float, holding: int, state: int, starting: float, tick: float
    ) -> tuple[float, ...]:
        """Expected costs of (wait, on-demand, spot) for the next tick (``tick`` steps) from a fractional state, then
        the plan: a new instance runs through its restart first; a held one goes on (through what is left of its
        restart). The policy asks this every tick, so no choice is held for a whole step."""
        key = self.key
        restart = key.restart_steps
        wait = self.value(steps - tick, slack - tick, NONE, state)
        on_demand = self._go(steps, slack, ON_DEMAND, state, starting if holding == ON_DEMAND else restart, tick)
        spot = INF
        if state < self.buckets:
            start = starting if holding == SPOT else restart
            going = self._go(steps, slack, SPOT, state, start, tick)
            lost = min(1.0, self.hazards.up_end[state] * max(start, tick))
            nxt = 0 if self.hazards.move_share >= 0.5 else self.buckets
            half = max(start, tick) / 2
            after = self.value(steps - half, slack - half, NONE, nxt)
            spot = (1 - lost) * going + lost * (key.spot_cost * half + after)
        return (wait, on_demand, spot)

    def _go(self, steps: float, slack: float, holding: int, state: int, start: float, tick: float) -> float:
        cost = self.key.on_demand_cost if holding == ON_DEMAND else self.key.spot_cost
        if start > 0:
            return cost * start + self.value(steps - start, slack - start, holding, state)
        return cost * tick + self.value(steps - tick, slack, holding, state)

    @staticmethod
    def _run(work: float, start: float, cost: float) -> float | None:
        """The cost of finishing within this step (start-up and the work left), None if the work outlasts it."""
        if work <= 1 - start + 1e-9:
            return cost * (start + work)
        return None


def _mix(a: float, b: float, frac: float) -> float:
    """Linear between a and b; where one is infinite, the other (feasibility is checked apart, exactly)."""
    if a == INF:
        return b
    if b == INF:
        return a
    return a + (b - a) * frac


_PLANS: OrderedDict[tuple[object, ...], Plan] = OrderedDict()
_KEPT = 32


def plan_for(
    outlook: Outlook | None,
    *,
    tick_s: float,
    deadline_ticks: float,
    restart_ticks: float,
    spot_price: float,
    on_demand_price: float,
    time_left_ticks: float,
    slack_ticks: float,
) -> Plan:
    """The plan of this model (solved once and kept, large enough for the state asked about: time left and slack
    in ticks)."""
    step_ticks = max(math.ceil(restart_ticks), math.ceil(deadline_ticks / STEPS), 1)
    hours = step_ticks * tick_s / 3600
    model = (outlook, step_ticks, restart_ticks, tick_s, spot_price, on_demand_price)
    steps = max(math.ceil(time_left_ticks / step_ticks) + 1, 1)
    slack = max(math.ceil(slack_ticks / step_ticks) + 1, 1)
    plan = _PLANS.get(model)
    if plan is not None and plan.key.steps >= steps and plan.key.slack >= slack:
        _PLANS.move_to_end(model)
        return plan
    key = Key(
        outlook, step_ticks, restart_ticks / step_ticks, spot_price * hours, on_demand_price * hours, steps, slack
    )
    plan = Plan(key, fit(outlook, step_ticks * tick_s))
    _PLANS[model] = plan
    while len(_PLANS) > _KEPT:
        _PLANS.popitem(last=False)
    return plan
