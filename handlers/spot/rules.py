"""Where the next stretch of a job runs: spot (in which zone), on-demand, nothing for now, or stop.

The bot asks at launch, at each interruption or capacity error and on a periodic tick; ``finetune-bot
simulate`` asks at every tick of a spot trace. Both describe the moment as the same :class:`Situation` and call
the same policy function, so what the simulator measures is what the bot does. A policy is pure: all it knows
is in the Situation (times in seconds, prices per hour of everything the job holds), and its answer carries
its reason as a :class:`~handlers.reasons.Reason`, so a job card can say "on-demand now: 6 h of work left, 7 h
to the deadline" in the channel's language.

Named policies (:data:`SIMULATED_POLICIES`, those the simulator compares; the bot's registry, with
``spot-first`` beside them, is :data:`handlers.spot.policies.POLICIES`): ``deadline-aware`` (the default), and the
baselines ``greedy``, ``spot-only`` and ``on-demand``. The arithmetic they share is the *fallback test*: after
the next period, could a fresh on-demand instance (restart overhead included) still finish the work before the
deadline, even if spot were lost at the worst moment? A policy takes a risk only while the answer stays yes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from handlers.jobs import Market
from handlers.policy_reasons import WORDING
from handlers.reasons import Reason

Action = Literal["spot", "on-demand", "wait", "stop"]
# Why the policy is asked: the first launch, an instance lost to spot, a launch refused for capacity, the timer.
Event = Literal["launch", "interrupted", "capacity", "tick"]


@dataclass(frozen=True, slots=True)
class ZoneView:
    """One zone as the policy sees it now.

    ``available``: spot can be had there now (True), it cannot (False: a capacity error, an instance just
    reclaimed), or nobody knows (None: the bot finds out by trying). ``availability``: the share of recent time
    spot was there (0..1; a trace's recent past, a placement score), None when unknown. ``age_s``: how long the
    zone has been as it is now (with spot, or without), None when unknown: the simulator tells it where it tells
    everything, the live bot never knows it, and no policy of the bot reads it (the bench's plan does).
    ``move_cost``: dollars a stretch there moves across regions (the checkpoint restored from the home region's
    bucket and committed back; 0 in the home region); ``restart_extra_s``: its start-up beyond ``restart_s`` (the
    slower cross-region restore). :mod:`handlers.spot.zones` works both out.
    """

    name: str
    available: bool | None = None
    availability: float | None = None
    age_s: float | None = None
    move_cost: float = 0.0
    restart_extra_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Holding:
    """What the job holds now: nothing, or an instance (market, zone) with ``starting_s`` of its start-up left."""

    market: Market | None = None
    zone: str | None = None
    starting_s: float = 0.0


NOTHING = Holding()


@dataclass(frozen=True, slots=True, kw_only=True)
class Situation:
    """Everything a policy may know, in seconds and in prices per hour of all the job holds.

    ``work_left_s`` is training time (steps left × measured seconds per step); ``restart_s`` is what a new
    instance spends before it trains (boot, restore); ``period_s`` is how long until the policy is asked again
    (one tick of a trace; the bot's timer). ``checkpoint_interval_s`` is the work an instance lost *without*
    a notice takes with it (0 where notices are honoured, as the simulator models). ``time_left_s`` None: no
    deadline. ``budget`` None: no budget; ``spent`` counts what the job has been billed so far.
    ``switch_ahead``: a switch of market launches the new instance before the held one stops (one node, in the bot
    since make-before-break), so a refused return to spot costs nothing; a gang still stops first. ``told``: the
    policy is told whether each zone has spot (the simulator's default view); the live bot never is: it learns it
    by launching there.
    """

    event: Event
    work_left_s: float
    work_done_s: float = 0.0
    time_left_s: float | None = None
    elapsed_s: float = 0.0
    restart_s: float
    period_s: float
    checkpoint_interval_s: float = 0.0
    holding: Holding = NOTHING
    zones: tuple[ZoneView, ...] = ()
    spot_price: float
    on_demand_price: float
    spent: float = 0.0
    budget: float | None = None
    switch_ahead: bool = False
    told: bool = False


@dataclass(frozen=True, slots=True)
class Choice:
    """The policy's answer: what to hold for the next period, and why (for the card and the job's history)."""

    action: Action
    zone: str | None
    reason: Reason


# A spot policy: the situation in, a choice out (pure). Not the ``policy`` config section (handlers/policy_config.py).
SpotPolicy = Callable[[Situation], Choice]


# -- the shared arithmetic ---------------------------------------------------------------------------------


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 1)


def _spot_zones(s: Situation) -> list[ZoneView]:
    """Zones where spot may be had now (known available, or unknown and worth a try), in configured order."""
    return [zone for zone in s.zones if zone.available is not False]


def held_zone(s: Situation) -> ZoneView | None:
    """The zone of the spot instance the job holds, if it is still there."""
    if s.holding.market != "spot":
        return None
    return next((zone for zone in _spot_zones(s) if zone.name == s.holding.zone), None)


def progress_this_period(s: Situation, choice: Market) -> float:
    """Training time the next period adds when holding ``choice`` (a new instance first spends its restart)."""
    same = s.holding.market == choice and (choice == "on-demand" or held_zone(s) is not None)
    starting = s.holding.starting_s if same else s.restart_s
    return max(0.0, s.period_s - starting)


def fallback_slack(s: Situation, after: Market | None) -> float:
    """Seconds to spare if, after the next period holding ``after``, a fresh on-demand instance finished the job.

    Negative: holding ``after`` for one more period would leave the deadline out of reach of on-demand. Work
    made on spot counts (a noticed interruption loses none), less ``checkpoint_interval_s`` at risk.
    """
    assert s.time_left_s is not None
    made = progress_this_period(s, after) if after is not None else 0.0
    at_risk = s.checkpoint_interval_s if after == "spot" else 0.0
    return s.time_left_s - s.period_s - (s.restart_s + max(s.work_left_s - made, 0.0) + at_risk)


def slack_s(s: Situation) -> float:
    """Seconds to spare now beyond a fresh on-demand instance (its start-up included) finishing the work."""
    assert s.time_left_s is not None
    return s.time_left_s - s.restart_s - s.work_left_s - s.checkpoint_interval_s


def on_demand_need_s(s: Situation) -> float:
    """Time on-demand needs to finish from now: the running instance's, or a fresh one's start-up, plus the work."""
    starting = s.holding.starting_s if s.holding.market == "on-demand" else s.restart_s
    return starting + s.work_left_s


def _min_cost_to_finish(s: Situation) -> float:
    """The least the rest can cost: all of it on spot (a new instance pays its restart too)."""
    starting = s.holding.starting_s if held_zone(s) is not None else s.restart_s
    return (starting + s.work_left_s) / 3600 * s.spot_price


def _on_demand_cost_to_finish(s: Situation) -> float:
    return on_demand_need_s(s) / 3600 * s.on_demand_price


def _pick_zone(s: Situation, prefer_availability: bool) -> ZoneView | None:
    """Stay where the job's spot instance is; else the best other zone (by recent availability weighed against
    what moving there costs: :func:`cheapest_zone`), else the first in order."""
    held = held_zone(s)
    if held is not None:
        return held
    zones = [zone for zone in _spot_zones(s) if _start_fits(s, zone)]
    if not zones:
        return None
    if not prefer_availability:
        return zones[0]
    return cheapest_zone(zones, period_premium(s), s.spot_price)


def _start_fits(s: Situation, zone: ZoneView) -> bool:
    """Whether the deadline leaves room for the zone's longer start-up (another region's restore): the slack covers
    it, and after a period there a fresh on-demand instance could still finish. The deadline rules count a new
    instance's ``restart_s`` alone, so a zone that needs more is left out here."""
    if s.time_left_s is None or zone.restart_extra_s <= 0:
        return True
    made = max(0.0, s.period_s - s.restart_s - zone.restart_extra_s)
    after = s.time_left_s - s.period_s - (s.restart_s + max(s.work_left_s - made, 0.0) + s.checkpoint_interval_s)
    return after >= 0 and slack_s(s) >= s.restart_s + zone.restart_extra_s


def period_premium(s: Situation) -> float:
    """What one period off spot costs more than on it (on on-demand): what a zone's availability is worth until the
    policy looks again, the horizon it weighs a move against (a longer one moved jobs out of their home region for
    availability the next hours did not keep: ``bench/policy_regions.py``)."""
    return s.period_s / 3600 * max(s.on_demand_price - s.spot_price, 0.0)


def cheapest_zone(zones: Sequence[ZoneView], premium: float | None, spot_price: float) -> ZoneView | None:
    """The zone whose stretch costs least in expectation: the move's transfer, its extra start-up at the spot price,
    and the share of time it goes without spot (1 − availability; unknown: ½) times ``premium``
    (:func:`period_premium`). So another region's zone wins only where its availability is worth its move; with no
    move anywhere it is the best availability, ties in order. ``premium`` None (no work measured yet): availability
    first, the move's cost breaking ties."""

    def chance(zone: ZoneView) -> float:
        return zone.availability if zone.availability is not None else 0.5

    def cost(zone: ZoneView) -> tuple[float, float, float]:
        move = zone.move_cost + zone.restart_extra_s / 3600 * spot_price
        if premium is None:
            return (-chance(zone), move, 0.0)
        return (move + (1 - chance(zone)) * premium, -chance(zone), move)

    return min(zones, key=cost) if zones else None


def _values(s: Situation) -> dict[str, float]:
    return {"work_h": _hours(s.work_left_s), "left_h": _hours(s.time_left_s or 0.0)}


# -- the baselines -------------------------------------------------------------------------------------------


def on_demand(s: Situation) -> Choice:
    """Always on-demand: the cost every saving is measured against."""
    return Choice("on-demand", None, WORDING("spot-policy.on-demand.only"))


def spot_only(s: Situation) -> Choice:
    """Spot, never anything else: stay in the zone while it has capacity, else the first zone that has, else wait."""
    zone = _pick_zone(s, prefer_availability=False)
    if zone is None:
        return Choice("wait", None, WORDING("spot-policy.wait.only"))
    return Choice("spot", zone.name, WORDING("spot-policy.spot.only", zone=zone.name))


def greedy(s: Situation) -> Choice:
    """Spot while there is slack, waiting when no zone has it; on-demand once waiting would miss the deadline.

    Once on on-demand it stays there (the classic fallback after the slack is spent).
    """
    if s.time_left_s is None:
        return spot_only(s)
    if s.holding.market == "on-demand":
        return Choice("on-demand", None, WORDING("spot-policy.on-demand.deadline", **_values(s)))
    zone = _pick_zone(s, prefer_availability=False)
    if zone is not None and fallback_slack(s, "spot") >= 0:
        slack = fallback_slack(s, "spot")
        return Choice("spot", zone.name, WORDING("spot-policy.spot", zone=zone.name, slack_h=_hours(slack)))
    if zone is None and fallback_slack(s, None) >= 0:
        return Choice("wait", None, WORDING("spot-policy.wait", slack_h=_hours(fallback_slack(s, None))))
    return last_resort(s)


def last_resort(s: Situation) -> Choice:
    """On-demand because nothing cheaper keeps the deadline; or, past hope, whatever finishes soonest."""
    if on_demand_need_s(s) <= (s.time_left_s or 0.0):
        return Choice("on-demand", None, WORDING("spot-policy.on-demand.deadline", **_values(s)))
    late = WORDING("spot-policy.late", **_values(s))
    held = held_zone(s)
    if held is not None and s.holding.starting_s < s.restart_s:
        return Choice("spot", held.name, late)  # already past (part of) its start-up: the soonest finish
    return Choice("on-demand", None, late)


# -- the deadline-aware default ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadlineAware:
    """Uniform Progress ("Can't Be Late", NSDI'24), made aware of recent availability, with a way back to spot.

    Every threshold is in restarts (``restart_s``, the measured start-up) or in shares of the time left, so
    the same rules hold at any restart overhead up to the one switch that weighs the restart against spot's
    typical stretch (below: past it, greedy's rules); the *slack* is the time to spare beyond a fresh on-demand
    instance (start-up included) finishing the work.

    - Spot whenever a zone has it and the slack covers the new instance's whole start-up (a start-up cut short
      by the fallback is spot paid for nothing); stay in the zone of the job's instance, else take the zone
      with the best recent availability.
    - No spot anywhere: switching to on-demand early pays off only if it keeps a way back to spot: the
      on-demand start-up, the spot start-up on the way back, and two more for the outages after that, so
      while the slack is under ``gate`` restarts it waits, as long as a spot start-up still fits (after that
      no spot can help: on-demand at once, the same cost). Above it, on-demand when the job is behind
      ``pace`` × an even pace to the deadline, or the slack is under ``reserve`` restarts plus ``kappa`` ×
      the outages to expect in the time left (1 − availability of any zone); else wait.
    - On on-demand: go back to spot (a new instance) as soon as a zone has it, the slack still covers two
      more start-ups (this one, and a fallback to on-demand right after it) so a return to spot can never
      cost the deadline, and the rest on spot, start-up included, costs less than on on-demand; else stay.
    - Leaving spot early and coming back pays only where a return that finds no spot costs nothing: the bot
      launches the spot instance ahead (one node), or the policy is told where spot is. A job whose switch stops
      first and that learns of spot only by launching (a gang, a group mode, in the bot) keeps greedy's rules
      for the deadline: spot while the slack allows, on-demand once it must, and no return. Each refused return
      would cost it a start-up, and the wait that follows. Told only what the bot knows
      (``bench/policy_traces.py --live``, restarts of 3, 12 and 30 minutes), its own rules cost 0.035-0.073 of
      the optimum more than greedy's on the 4- and 16-node dates, and for one node that stops first more in 8
      of 9 cells (up to 0.092; 0.007 less on the held-out split at 30 minutes).
    - A restart too long for spot's stretches: greedy's rules, for every job. Leaving spot early and returning to
      it bet restarts on the spot stretch a return catches: it pays only if that stretch outlasts the spot
      start-up (``R``) and then saves, at the price gap, the two start-ups the return adds (its own, and the one
      after the stretch ends, both at spot's price at the least: the fallback waits for spot where the slack
      allows). So the stretch must last ``R · (1 + ρ) / (1 − ρ)``, ρ the spot price over the on-demand price (1.86
      restarts at V100 prices). Where the typical stretch (``spot_stretch_s``: the median stretch of spot in one
      zone on the tuning split, 37 min: ``bench/spot_learned.py``'s ``ONE_ZONE``) is shorter than that, most
      returns lose, so greedy's rules hold once ``restart_s > spot_stretch_s · (1 − ρ) / (1 + ρ)`` (19.9 min at
      V100 prices). Why it generalises: the break-even is the prices' and the restart's, no fitted number; the
      stretch is the one figure taken from traces, from the tuning split alone; and the switch sits below where
      the rules stop paying on the tuning split (between 21 and 27 min), so a date whose stretches run a little
      shorter still finds greedy's rules where its own would lose. ``bench/policy_traces.py`` records the result.
    - Budget: stop (with a checkpoint) once even all-spot would go over it; never choose on-demand that would
      (spot or waiting instead, even at the deadline's expense: a budget is a limit, a deadline a target).
    - No deadline: spot as the bot always did (its launch plan falls back to on-demand on capacity errors),
      and a job on on-demand stays there, as it always did.

    The defaults were chosen on the tuning split of ``bench/policy_traces.py`` at restarts of 3, 6, 12 and
    30 minutes together (see its docstring for the splits and the figures).
    """

    pace: float = 1.2
    kappa: float = 0.2
    reserve: float = 1.0
    gate: float = 4.0
    spot_stretch_s: float = 37 * 60  # the median spot stretch of one zone, tuning split (see the docstring)

    def __call__(self, s: Situation) -> Choice:
        zone = _pick_zone(s, prefer_availability=True)
        if s.budget is not None and s.spent + _min_cost_to_finish(s) > s.budget:
            need = s.spent + _min_cost_to_finish(s)
            return Choice("stop", None, WORDING("spot-policy.stop.budget", need=need, budget=s.budget, spent=s.spent))
        if s.time_left_s is None:
            if s.holding.market == "on-demand":  # put there by a person, or by the launch plan's fallback
                return Choice("on-demand", None, WORDING("spot-policy.on-demand.kept"))
            if zone is None:
                return Choice("wait", None, WORDING("spot-policy.wait.only"))
            return Choice("spot", zone.name, WORDING("spot-policy.spot.no-deadline", zone=zone.name))
        if s.budget is not None and s.spent + _on_demand_cost_to_finish(s) > s.budget:
            if zone is not None:
                return Choice("spot", zone.name, WORDING("spot-policy.spot.budget", zone=zone.name, budget=s.budget))
            return Choice("wait", None, WORDING("spot-policy.wait.budget", budget=s.budget))
        if not s.switch_ahead and not s.told:
            return greedy(s)  # a switch that stops first, blind to where spot is: see the docstring
        if self.restart_too_long(s):
            return greedy(s)  # a return to spot would not outlast its restarts: see the docstring
        if s.holding.market == "on-demand":
            spare = s.time_left_s - s.period_s - (2 * s.restart_s + s.work_left_s + s.checkpoint_interval_s)
            cheaper = (s.restart_s + s.work_left_s) * s.spot_price < s.work_left_s * s.on_demand_price
            if zone is not None and spare >= 0 and cheaper:
                return Choice(
                    "spot", zone.name, WORDING("spot-policy.spot.back", zone=zone.name, slack_h=_hours(spare))
                )
            return Choice("on-demand", None, WORDING("spot-policy.on-demand.deadline", **_values(s)))
        spare = slack_s(s)
        start_up = s.holding.starting_s if held_zone(s) is not None else s.restart_s
        if zone is not None and fallback_slack(s, "spot") >= 0 and spare >= start_up:
            slack = fallback_slack(s, "spot")
            return Choice("spot", zone.name, WORDING("spot-policy.spot", zone=zone.name, slack_h=_hours(slack)))
        slack = fallback_slack(s, None)
        if zone is not None or slack < 0 or spare < s.restart_s:
            return last_resort(s)
        if spare >= self.gate * s.restart_s:
            if self.behind(s):
                return Choice("on-demand", None, WORDING("spot-policy.on-demand.pace", **_values(s)))
            kept = self.reserve * s.restart_s + self.kappa * (1 - any_availability(s)) * s.time_left_s
            if slack < kept:
                return Choice("on-demand", None, WORDING("spot-policy.on-demand.reserve", slack_h=_hours(slack)))
        return Choice("wait", None, WORDING("spot-policy.wait", slack_h=_hours(slack)))

    def restart_too_long(self, s: Situation) -> bool:
        """Whether the typical spot stretch is shorter than a return's break-even, ``restart_s · (1 + ρ) / (1 − ρ)``."""
        ratio = s.spot_price / s.on_demand_price if s.on_demand_price > 0 else 1.0
        return s.restart_s * (1 + ratio) > self.spot_stretch_s * (1 - ratio)

    def behind(self, s: Situation) -> bool:
        """Behind ``pace`` × an even pace: the work left is more than that share of all the work (start-ups
        set aside) that an even pace would still have to do in the time left."""
        assert s.time_left_s is not None
        total_work = s.work_done_s + s.work_left_s
        usable = max(s.elapsed_s + s.time_left_s - s.restart_s, s.period_s)
        return s.work_left_s > self.pace * total_work * max(s.time_left_s - s.restart_s, 0.0) / usable


deadline_aware = DeadlineAware()


def any_availability(s: Situation) -> float:
    """The chance that some zone has spot, from the zones' recent shares taken as independent (unknown: ½)."""
    none = 1.0
    for zone in s.zones:
        none *= 1 - (zone.availability if zone.availability is not None else 0.5)
    return 1 - none


DEFAULT_POLICY = "deadline-aware"
SIMULATED_POLICIES: dict[str, SpotPolicy] = {
    "deadline-aware": deadline_aware,
    "greedy": greedy,
    "on-demand": on_demand,
    "spot-only": spot_only,
}
