"""The tick model ``finetune-bot simulate`` replays a spot policy in, over availability traces.

Exactly the model of the issue that asked for it (issue 15), so results can be checked by hand:

- time runs in ticks of the traces' ``gap_seconds`` (h hours each); the scenario starts at tick round(H / h)
  and the job needs ceil(W / h) ticks of progress, by floor(D / h) ticks after the start;
- each tick the job holds nothing, an on-demand instance, or a spot instance in zone z, the latter only while
  z's trace reads at least ``nodes``; a held spot instance whose zone then reads fewer is preempted;
- an instance is new when the choice differs from the previous tick's (the first launch included); a new one
  spends ceil(R · 60 / gap_seconds) ticks of overhead, then each tick adds one tick of progress; progress is
  never lost at a preemption (the notice-driven checkpoint), only the overhead is paid again;
- a held tick costs its price × h; the job is done at the tick its progress is complete (that tick paid whole).

A gang (``nodes`` ≥ 2) with a ``replace_overhead`` (ticks; issue 23) loses only the nodes its zone no longer has:
while the zone still has at least one of them, the survivors hold (each billing its share, ``spot_price / nodes``,
and no progress) until the zone has ``nodes`` again, when the lost nodes' replacements come and the gang pays
``replace_overhead`` ticks (all nodes billed) before it trains again; after every ``hold`` ticks of holding
:func:`~handlers.spot.gang.wait_or_move` chooses between one more hold and moving the whole gang (the survivors
are released and the policy chooses as after a preemption: the whole gang's ``overhead`` again), and at any tick
once the deadline's slack would not cover a hold and a move. Hold ticks are the
gang's own, not the policy's (no choice is recorded for them). Without ``replace_overhead`` every loss is the whole
gang's, as before gangs.

Past the end of its traces no zone has spot (a policy may still finish on on-demand); a policy that holds
nothing there once the deadline has passed would wait forever, so the run ends unfinished. The policy is
called every tick with the same :class:`~handlers.spot.rules.Situation` the bot builds, so it is the bot's own
code that is measured. Beyond what the bot gives, each zone's age (ticks since its spot came or went), which no
policy of the bot reads (the bench's ``deadline-aware-plan``, ``bench/spot_plan.py``, plans with it).

By default the policy is told every zone's availability at every tick, which the bot never is. With ``live`` it
is told only what the bot knows (:func:`handlers.spot.situation.live_situation`): the zone of its spot instance
has spot while it lasts; a zone where spot was refused or reclaimed has none for the cool-down (one tick, the
policy's period, as :func:`~handlers.spot.situation.lost_zones`); of every other zone, nothing (its recent share of spot
stands in for the placement score, and no zone has an age). A spot choice in a zone without spot is refused at
no cost, as a launch is: the zone counts as without spot for the cool-down and the policy is asked again at the
same tick (``capacity``). A job on on-demand that goes for spot keeps training there when the launch is refused,
as the bot switches (the spot instance is launched ahead, and the on-demand one stops only once that is up), and
tries again at the next tick; a gang, which the bot still switches by stopping first, loses its on-demand nodes and
pays for new ones. A one-node switch that succeeds is the bot's make-before-break too: through every start-up tick
of the new instance but the last, the old one (on-demand, or spot while its zone has spot) trains on and both
bill; the last pays the checkpoint and the restore (the new one bills, nothing trains). A start-up of one tick has
no overlap. A spot instance launched ahead that is reclaimed while it starts is given up: the old one trains on,
with no start-up of its own, and the zone is out for the cool-down. The offline optimum is of the model without
launches ahead, so a live run can cost less than the same policy told everything.

Regions (issue 51): a run with a ``home_region`` (where the bucket has the checkpoint) charges each stretch started in
a zone of another region ``move_cost`` (the checkpoint restored from the home bucket and committed back) and gives it
``far_overhead`` ticks of start-up (the slower restore); the policy sees both in that zone's
:class:`~handlers.spot.rules.ZoneView`, as the bot's do. On-demand runs in the home region.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate, groupby

from handlers.jobs import Market
from handlers.regions import region_of
from handlers.spot.gang import GangHold, short_of_slack, wait_or_move
from handlers.spot.rules import NOTHING, Choice, Event, Holding, Situation, SpotPolicy, ZoneView
from handlers.spot.situation import zone_view
from handlers.spot.zones import STAY, Move

# How far back a zone's availability share looks (the policy's "recent availability"), in hours.
AVAILABILITY_WINDOW_HOURS = 24


@dataclass(frozen=True, slots=True)
class Zone:
    """One zone's trace: how many spot instances it had (or kept) at each tick, and its region (None: the one its
    name says, :func:`~handlers.regions.region_of`)."""

    name: str
    counts: Sequence[int]
    region: str | None = None

    @property
    def in_region(self) -> str:
        return self.region if self.region is not None else region_of(self.name)


@dataclass(frozen=True, slots=True)
class Run:
    """A scenario in ticks (see :func:`to_ticks`), with prices per hour of all the job's ``nodes``."""

    zones: tuple[Zone, ...]
    gap_seconds: int
    start: int
    work: int
    deadline: int
    overhead: int
    spot_price: float
    on_demand_price: float
    nodes: int = 1
    budget: float | None = None
    replace_overhead: int | None = None  # ticks of one node's replacement (a gang's replace-one); None: none
    hold: int = 1  # ticks of one hold: wait_or_move chooses again after each
    live: bool = False  # tell the policy only what the bot knows of the zones (the module's docstring)
    # Regions: the home region (its bucket has the checkpoint; None: nothing moves), what a stretch in a zone outside
    # it pays for the checkpoint's transfer (restored in, committed out), and its start-up there in ticks (the slower
    # restore; None: ``overhead``).
    home_region: str | None = None
    move_cost: float = 0.0
    far_overhead: int | None = None

    def far(self, zone: Zone) -> bool:
        """Whether a stretch in ``zone`` moves the checkpoint across regions."""
        return self.home_region is not None and zone.in_region != self.home_region

    def overhead_in(self, zone: Zone | None) -> int:
        """A new instance's start-up in ``zone`` (None: on-demand, in the home region)."""
        if zone is None or not self.far(zone) or self.far_overhead is None:
            return self.overhead
        return self.far_overhead

    @property
    def replaces_one(self) -> bool:
        """Whether a gang that lost some of its nodes holds for their replacements (else it restarts whole)."""
        return self.nodes >= 2 and self.replace_overhead is not None

    @property
    def hours_per_tick(self) -> Fraction:
        return Fraction(self.gap_seconds, 3600)

    @property
    def end(self) -> int:
        """The first tick past the shortest trace."""
        return min(len(zone.counts) for zone in self.zones) if self.zones else self.start


@dataclass(slots=True)
class Outcome:
    """What one policy did over one run; ``choices`` is the action of each tick (for tests and the curious)."""

    spot_ticks: int = 0
    on_demand_ticks: int = 0
    preemptions: int = 0
    finish: int | None = None  # ticks from the start to the end of the tick that completed the work
    stopped: bool = False
    choices: list[Choice] = field(default_factory=list)
    holds: int = 0  # losses the gang held for (replace-one), each until its replacements came or it moved
    replaced: int = 0  # holds that ended with the replacements
    moves: int = 0  # holds that ended with wait_or_move's "move"
    survivor_node_ticks: int = 0  # node-ticks the survivors billed while they held, training nothing
    refusals: int = 0  # spot launches refused for capacity (``live`` only: otherwise the policy knows)
    region_moves: int = 0  # stretches started outside the home region, each paying the run's ``move_cost``

    def cost(self, run: Run) -> float:
        h = run.hours_per_tick
        return float(
            self.spot_ticks * h * _exact(run.spot_price)
            + self.on_demand_ticks * h * _exact(run.on_demand_price)
            + self.survivor_cost_exact(run)
            + self.transfer_cost_exact(run)
        )

    def transfer_cost(self, run: Run) -> float:
        """What the checkpoint's moves across regions cost (part of :meth:`cost`)."""
        return float(self.transfer_cost_exact(run))

    def transfer_cost_exact(self, run: Run) -> Fraction:
        return self.region_moves * _exact(run.move_cost)

    def survivor_cost(self, run: Run) -> float:
        """What the survivors paid while they held (part of :meth:`cost`)."""
        return float(self.survivor_cost_exact(run))

    def survivor_cost_exact(self, run: Run) -> Fraction:
        return self.survivor_node_ticks * run.hours_per_tick * _exact(run.spot_price) / run.nodes

    def met(self, run: Run) -> bool:
        return self.finish is not None and self.finish <= run.deadline


def to_ticks(
    gap_seconds: int, start_hour: Fraction, work_hours: Fraction, deadline_hours: Fraction, restart_minutes: Fraction
) -> tuple[int, int, int, int]:
    """(start tick, work ticks, deadline ticks, overhead ticks), computed exactly from the typed decimals."""
    h = Fraction(gap_seconds, 3600)
    start = round(start_hour / h)
    work = -(-work_hours // h)  # ceil
    deadline = deadline_hours // h
    overhead = -(-(restart_minutes * 60) // gap_seconds)
    return int(start), int(work), int(deadline), int(overhead)


def simulate(run: Run, policy: SpotPolicy) -> Outcome:
    """Replay ``policy`` over ``run``, tick by tick, exactly as the module docstring says."""
    gap = run.gap_seconds
    window = max(1, round(AVAILABILITY_WINDOW_HOURS * 3600 / gap))
    up = [[count >= run.nodes for count in zone.counts] for zone in run.zones]
    prefix = [_prefix_available(zone) for zone in up]
    ages = [_ages(zone) for zone in up]
    out = Outcome()
    previous: tuple[Market, str | None] | None = None
    starting = 0  # overhead ticks the held instance still has to spend
    progress = 0
    cost = Fraction(0)
    h = run.hours_per_tick
    tick_price = {"spot": h * _exact(run.spot_price), "on-demand": h * _exact(run.on_demand_price)}  # a tick, exactly
    t = run.start
    end = run.end
    hold_since: int | None = None  # the tick a gang's hold began (replace-one), None while it is whole
    survivors = 0
    cooldown = 1  # a zone refused or reclaimed is without spot until the policy's next look (situation.lost_zones)
    lost_until = [run.start] * len(run.zones)  # live: the tick from which a refused or reclaimed zone is unknown again
    ahead_of: tuple[Market, str | None] | None = None  # live: the instance that trains on while its successor starts
    moves = [_move(run, zone) for zone in run.zones]
    while progress < run.work:
        available = [t < len(zone) and zone[t] for zone in up]
        holding = NOTHING
        event: Event = "launch" if t == run.start else "tick"
        if previous is not None and ahead_of is not None and not _up(run, previous, available):
            # Live: the instance launched ahead was reclaimed while it started; the old one trains on (the bot gives
            # up its launch ahead), and the zone is without spot for the cool-down.
            out.preemptions += 1
            lost_until[_index(run, previous[1])] = t + cooldown
            previous, ahead_of, starting = ahead_of, None, 0
        if previous is not None:
            market, zone_name = previous
            if market == "spot" and not available[_index(run, zone_name)]:
                z = _index(run, zone_name)
                left = min(_count(run.zones[z], t), run.nodes - 1, survivors if hold_since is not None else run.nodes)
                if run.replaces_one and left >= 1:
                    if hold_since is None:
                        hold_since, out.holds = t, out.holds + 1
                    survivors = left
                    waited = t - hold_since
                    slack = (run.deadline - (t - run.start) - (run.work - progress)) * gap
                    # At each hold's end, and at any tick once the deadline's slack is short: a hold never spends
                    # the slack a move would need (the bot's hold timer should be cut short the same way).
                    pressed = short_of_slack(slack, run.hold * gap, run.overhead * gap)
                    decide = pressed or (waited > 0 and waited % run.hold == 0)
                    share = _share(prefix[z], t, window)
                    if not decide or _gang_choice(run, survivors, waited, share, slack) == "wait":
                        out.survivor_node_ticks += survivors
                        cost += survivors * tick_price["spot"] / run.nodes
                        t += 1
                        continue
                    out.moves += 1  # the survivors are released; the policy chooses as after a preemption
                else:
                    out.preemptions += 1
                    lost_until[z] = t + cooldown
                hold_since = None
                event = "interrupted"
            else:
                if hold_since is not None:  # the lost nodes' replacements came: one node's restart overhead
                    hold_since, out.replaced = None, out.replaced + 1
                    starting = run.replace_overhead or 0
                holding = Holding(market, zone_name, starting * gap)
        while True:
            views = tuple(
                zone_view(zone.name, holding, t < lost_until[i], _share(prefix[i], t, window), moves[i])
                if run.live
                else ZoneView(
                    zone.name,
                    available[i],
                    _share(prefix[i], t, window),
                    _age(ages[i], t, gap),
                    moves[i].cost,
                    moves[i].extra_s,
                )
                for i, zone in enumerate(run.zones)
            )
            situation = Situation(
                event=event,
                work_left_s=(run.work - progress) * gap,
                work_done_s=progress * gap,
                time_left_s=(run.deadline - (t - run.start)) * gap,
                elapsed_s=(t - run.start) * gap,
                restart_s=run.overhead * gap,
                period_s=gap,
                holding=holding,
                zones=views,
                spot_price=run.spot_price,
                on_demand_price=run.on_demand_price,
                spent=float(cost),
                budget=run.budget,
                switch_ahead=run.nodes == 1,
                told=not run.live,
            )
            choice = policy(situation)
            z = _index(run, choice.zone) if choice.action == "spot" and choice.zone is not None else -1
            if not run.live or z < 0 or available[z] or t < lost_until[z]:
                break  # (a zone it was told has no spot: the policy's bug, which _held reports)
            # Live: the launch is refused for capacity (free), and the zone is without spot for the cool-down. One
            # node on on-demand trains on there until the next tick (its spot launch went out ahead); otherwise the
            # policy is asked again (a gang leaving on-demand had stopped its nodes first).
            out.refusals += 1
            lost_until[z] = t + cooldown
            if holding.market == "on-demand" and run.nodes == 1:
                choice = Choice("on-demand", None, choice.reason)
                break
            if holding.market == "on-demand":
                holding, previous = NOTHING, None
            event = "capacity"
        out.choices.append(choice)
        if choice.action == "stop":
            out.stopped = True
            return out
        held = _held(run, choice, available)
        if held is None:
            previous = None
            if t >= end and t - run.start >= run.deadline:
                return out  # past the deadline, spot will never come back, and the policy will not pay on-demand
            t += 1
            continue
        if held != previous:  # a new instance (the first launch, a move, a return after a loss or a wait)
            zone = run.zones[_index(run, held[1])] if held[0] == "spot" else None
            starting = run.overhead_in(zone)
            if zone is not None and run.far(zone):
                out.region_moves += 1
                cost += _exact(run.move_cost)
            ahead_of = previous if _launches_ahead(run, previous, held, available) else None
        if ahead_of is not None and (starting <= 1 or not _up(run, ahead_of, available)):
            ahead_of = None  # the checkpoint and the restore (or the old instance was taken: the new one goes on)
        billed = [held[0]] if ahead_of is None else [held[0], ahead_of[0]]  # launched ahead: both bill
        for market in billed:
            if market == "spot":
                out.spot_ticks += 1
            else:
                out.on_demand_ticks += 1
            cost += tick_price[market]
        if starting > 0:
            starting -= 1
            progress += ahead_of is not None  # the old instance trains on while the new one boots
        else:
            progress += 1
        previous = held
        t += 1
    out.finish = t - run.start
    return out


def _move(run: Run, zone: Zone) -> Move:
    """What the policy is told a stretch in ``zone`` moves across regions: the run's transfer and extra start-up."""
    if not run.far(zone):
        return STAY
    return Move(run.move_cost, (run.overhead_in(zone) - run.overhead) * run.gap_seconds)


def _launches_ahead(
    run: Run, previous: tuple[Market, str | None] | None, held: tuple[Market, str | None], available: list[bool]
) -> bool:
    """Whether the bot would launch ``held`` ahead of stopping ``previous``: live, one node, a switch of market from
    an instance that is still up."""
    if not run.live or run.nodes != 1 or previous is None or previous[0] == held[0]:
        return False
    return _up(run, previous, available)


def _up(run: Run, instance: tuple[Market, str | None], available: list[bool]) -> bool:
    """Whether an instance held on (market, zone) is still there this tick: on-demand always, spot while its zone has
    spot."""
    return instance[0] == "on-demand" or available[_index(run, instance[1])]


def _count(zone: Zone, t: int) -> int:
    """The zone's count at ``t``; none past the end of its trace."""
    return zone.counts[t] if t < len(zone.counts) else 0


def _gang_choice(run: Run, survivors: int, waited: int, share: float, slack: int) -> str:
    """wait_or_move for a gang that has held ``waited`` ticks, its zone's recent availability as the chance."""
    gap = run.gap_seconds
    return wait_or_move(
        GangHold(
            nodes=run.nodes,
            survivors=survivors,
            node_price_per_hour=run.spot_price / run.nodes,
            waited_seconds=waited * gap,
            hold_seconds=run.hold * gap,
            replace_seconds=(run.replace_overhead or 0) * gap,
            move_seconds=run.overhead * gap,
            availability=share,
            slack_seconds=slack,
        )
    )


def _held(run: Run, choice: Choice, available: list[bool]) -> tuple[Market, str | None] | None:
    if choice.action == "wait":
        return None
    if choice.action == "on-demand":
        return ("on-demand", None)
    if choice.zone is None or not available[_index(run, choice.zone)]:
        raise ValueError(f"the policy chose spot in {choice.zone!r}, which has no spot at this tick")
    return ("spot", choice.zone)


def _index(run: Run, zone_name: str | None) -> int:
    for i, zone in enumerate(run.zones):
        if zone.name == zone_name:
            return i
    raise ValueError(f"the policy chose a zone this run does not have: {zone_name!r}")


def _prefix_available(up: Sequence[bool]) -> list[int]:
    """Per tick t, how many of the ticks before it had spot (``len(up) + 1`` entries). Every run reads its zones'
    whole traces this way, so it is summed in C (itertools), not tick by tick."""
    return list(accumulate(up, initial=0))


def _ages(up: Sequence[bool]) -> list[int]:
    """Per tick, the ticks before it that the zone was as it is then (with spot or without), without a break: each
    stretch of equal ticks counts 0, 1, 2, … (built a stretch at a time, as above)."""
    out: list[int] = []
    for _, stretch in groupby(up):
        out.extend(range(len(list(stretch))))
    return out


def _age(ages: list[int], t: int, gap: int) -> float | None:
    """The zone's age at ``t`` in seconds; past the trace's end, unknown."""
    return ages[t] * gap if t < len(ages) else None


def _share(prefix: list[int], t: int, window: int) -> float:
    """The share of the ``window`` ticks up to and including ``t`` that had spot (none past the trace's end)."""
    last, first = t + 1, max(0, t + 1 - window)
    known = len(prefix) - 1
    return (prefix[min(last, known)] - prefix[min(first, known)]) / (last - first)


def _exact(price: float) -> Fraction:
    """A price as the decimal it was typed as, so costs add up exactly (0.1 + 0.2 is 0.3 here)."""
    return Fraction(str(price))
