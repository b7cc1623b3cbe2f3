"""The spot policies' decisions, rule by rule, on hand-made situations and small hand-made traces.

Traces tick by the hour with spot at $1/h and on-demand at $3/h, so a cost is a count of ticks to check by eye.
"""

from __future__ import annotations

from handlers import job_options
from handlers.policy_reasons import WORDING
from handlers.spot.rules import (
    NOTHING,
    SIMULATED_POLICIES,
    Holding,
    SpotPolicy,
    ZoneView,
    fallback_slack,
    greedy,
    on_demand,
    spot_only,
)
from handlers.spot.simulator import Outcome, Run, simulate
from tests.spot_cases import HOUR, OWN_RULES, RESERVE, hourly_run, policy_reasons, situation, zones


def played(policy: str | SpotPolicy, run: Run) -> tuple[str, Outcome]:
    """The policy's (a name, or the policy) action at each tick (s spot, D on-demand, . nothing, X stop), and the
    outcome."""
    outcome = simulate(run, SIMULATED_POLICIES[policy] if isinstance(policy, str) else policy)
    shown = "".join({"spot": "s", "on-demand": "D", "wait": ".", "stop": "X"}[c.action] for c in outcome.choices)
    return shown, outcome


# -- the shared fallback test and the baselines ------------------------------------------------------------


def test_the_fallback_test_counts_the_restart_and_what_this_period_adds() -> None:
    # 12 h left, 4 h of work, 1 h restart: waiting an hour leaves 12 - 1 - (1 + 4) = 6 h to spare.
    assert fallback_slack(situation(), None) == 6 * HOUR
    # A new spot instance spends this hour starting: no progress, the same as waiting.
    assert fallback_slack(situation(zones=zones(True)), "spot") == 6 * HOUR
    # A running one trains the hour, so the slack is kept.
    running = situation(zones=zones(True), holding=Holding("spot", "zone-a"))
    assert fallback_slack(running, "spot") == 7 * HOUR
    # A notice-less loss would take a checkpoint interval of work with it.
    risky = situation(zones=zones(True), holding=Holding("spot", "zone-a"), checkpoint_interval_s=1800)
    assert fallback_slack(risky, "spot") == 6.5 * HOUR


def test_on_demand_always_and_spot_only_never_pays_for_on_demand() -> None:
    assert on_demand(situation(zones=zones(True))).action == "on-demand"
    late = situation(zones=zones(False, False), time_left_s=HOUR)
    assert spot_only(late).action == "wait"


def test_spot_only_stays_in_its_zone_else_takes_the_lowest_index_available_zone() -> None:
    # zone-a, zone-b, zone-c: b first (a has none), then a when b goes although c has spot too.
    run = hourly_run([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], work=3, deadline=5)
    outcome = simulate(run, spot_only)
    assert [choice.zone for choice in outcome.choices] == ["zone-b", "zone-b", "zone-a", "zone-a", "zone-a"]
    # It stays in zone-b while b has spot, even when zone-a comes back.
    run = hourly_run([[1, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]], work=2, deadline=6)
    outcome = simulate(run, spot_only)
    assert [choice.zone for choice in outcome.choices] == ["zone-a", "zone-b", "zone-b", "zone-b"]
    assert outcome.preemptions == 1 and outcome.finish == 4


def test_greedy_spends_the_slack_waiting_then_stays_on_on_demand() -> None:
    # 3 h of work, 1 h restart, 7 h: spot at 0-1 (start-up, 1 h of work), gone from 2; waiting is safe while
    # 7 - t - 1 >= 1 + 2, i.e. until t = 3; at t = 4 it must take on-demand, and it stays there.
    run = hourly_run([[1, 1, 0, 0, 0, 1, 1]], work=3, deadline=7)
    shown, outcome = played("greedy", run)
    assert shown == "ss..DDD"
    assert outcome.met(run) and outcome.finish == 7


# -- the deadline-aware policy -----------------------------------------------------------------------------


def test_a_deadline_that_is_just_feasible_leaves_no_room_for_spot() -> None:
    # work + restart = deadline exactly: any spot start-up could cost the deadline, so on-demand from the start.
    run = hourly_run([[1] * 10], work=4, deadline=5)
    for name in ("deadline-aware", "greedy"):
        shown, outcome = played(name, run)
        assert shown == "DDDDD", name
        assert outcome.finish == 5 and outcome.met(run)
    # One hour more is enough for a spot attempt: lost at once, on-demand still makes it, to the hour.
    run = hourly_run([[1, 0, 0, 0, 0, 0, 0]], work=4, deadline=6)
    shown, outcome = played(OWN_RULES, run)
    assert shown == "sDDDDD"
    assert outcome.finish == 6 and outcome.met(run) and outcome.preemptions == 1
    # With an hour less than that, it is too late from the start: finish as soon as possible.
    choice = OWN_RULES(situation(zones=zones(True), work_left_s=4 * HOUR, time_left_s=4 * HOUR))
    assert choice.action == "on-demand" and choice.reason.key == "spot-policy.late"


def test_a_zone_that_comes_back_is_waited_for_while_the_slack_allows() -> None:
    # Spot goes for two hours with 10 h of slack: waiting costs nothing, the job resumes in the same zone.
    run = hourly_run([[1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]], work=4, deadline=12, overhead=0)
    shown, outcome = played(OWN_RULES, run)
    assert shown == "ss..ss"
    assert outcome.on_demand_ticks == 0 and outcome.preemptions == 1
    assert {choice.zone for choice in outcome.choices if choice.action == "spot"} == {"zone-a"}
    # With another zone up, it moves there at once instead of waiting.
    run = hourly_run([[1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1]], work=4, deadline=12, overhead=0)
    outcome = simulate(run, OWN_RULES)
    assert [choice.zone for choice in outcome.choices] == ["zone-a", "zone-a", "zone-b", "zone-b"]


def test_no_spot_and_little_slack_left_means_on_demand_now_with_its_reason() -> None:
    choice = OWN_RULES(situation(zones=zones(False, share=0.0), **RESERVE))
    assert choice.action == "on-demand" and choice.reason.key == "spot-policy.on-demand.reserve"
    # The same slack in 1 h restarts is 1.1 restarts: on-demand now could never return to spot (its own
    # start-up and the way back would cost two), so it waits on, as long as a spot start-up still fits ...
    few = {**RESERVE, "restart_s": HOUR, "work_left_s": 7.9 * HOUR}
    assert OWN_RULES(situation(zones=zones(False, share=0.0), **few)).action == "wait"
    # ... and once none fits, not even a zone with spot can help: on-demand at once (the cost of later).
    none_fits = OWN_RULES(situation(zones=zones(False, True, share=0.0), **{**few, "work_left_s": 8.1 * HOUR}))
    assert none_fits.action == "on-demand" and none_fits.reason.key == "spot-policy.on-demand.deadline"
    # Waiting until the fallback test fails is not on: the reason gives the work left and the time to go.
    choice = OWN_RULES(situation(zones=zones(False, share=0.0), work_left_s=6 * HOUR, time_left_s=7 * HOUR))
    assert choice.action == "on-demand"
    assert str(choice.reason) == "on-demand now: 6 h of work left, 7 h to the deadline"
    # Plenty of slack and zones that are usually up: it waits.
    assert OWN_RULES(situation(zones=zones(False, True, share=0.9), restart_s=0.0)).action == "spot"
    assert OWN_RULES(situation(zones=zones(False, False, share=0.9), restart_s=0.0)).action == "wait"


def test_it_goes_back_from_on_demand_to_spot_when_that_is_safe() -> None:
    # No spot for six hours, 6 h of work due in 14: it waits while on pace; at t = 3 it is behind 1.2 × an even
    # pace with 6 h (6 restarts) to spare, room to come back: on-demand. Spot is back at t = 6 with 8 h left
    # and 4 h of work: 8 - 1 - (2 + 4) >= 0, so it goes back, and finishes in time.
    run = hourly_run([[0] * 6 + [1] * 8], work=6, deadline=14)
    shown, outcome = played(OWN_RULES, run)
    assert shown == "...DDDsssss"
    back = outcome.choices[6]
    assert back.reason.key == "spot-policy.spot.back" and back.zone == "zone-a"
    assert outcome.met(run) and outcome.on_demand_ticks == 3
    # Spot back only at t = 9 (5 h left, 1 h of work): 5 - 1 - (2 + 1) >= 0, yet the rest on spot, start-up
    # included (2 h at $1), is cheaper than 1 h at $3: back it goes. At $2.5 spot it would not be.
    run = hourly_run([[0] * 9 + [1] * 5], work=6, deadline=14)
    assert played(OWN_RULES, run)[0] == "...DDDDDDss"
    pricey = situation(
        zones=zones(True), holding=Holding("on-demand"), work_left_s=HOUR, time_left_s=5 * HOUR, spot_price=2.5
    )
    assert OWN_RULES(pricey).action == "on-demand"
    # Without the slack for two more start-ups it stays on on-demand.
    tight = situation(zones=zones(True), holding=Holding("on-demand"), work_left_s=4 * HOUR, time_left_s=6 * HOUR)
    assert OWN_RULES(tight).action == "on-demand"


def test_live_a_job_whose_switch_stops_first_keeps_greedys_rules_one_that_launches_ahead_its_own() -> None:
    # The live bot learns whether a zone has spot only by launching there. Where its switch stops first (a gang, a
    # group mode), a return that finds no spot costs a start-up: the policy never leaves on-demand for a zone not
    # known to have spot, nor leaves spot early for on-demand, as greedy. Launching ahead (one node), it keeps its
    # own rules: back to spot at once.
    on_demand_now = {"holding": Holding("on-demand"), "time_left_s": 12 * HOUR, "told": False}
    unknown = (ZoneView("zone-a", None, 0.9),)
    stays = OWN_RULES(situation(zones=unknown, **on_demand_now))
    assert stays == greedy(situation(zones=unknown, **on_demand_now)) and stays.action == "on-demand"
    assert OWN_RULES(situation(zones=unknown, switch_ahead=True, **on_demand_now)).action == "spot"
    # No spot, slack of many restarts, behind an even pace: its own rules leave spot early, greedy's wait.
    early = {**RESERVE, "zones": zones(False, share=0.0), "told": False}
    assert OWN_RULES(situation(**early)).action == "wait"
    assert OWN_RULES(situation(**{**early, "switch_ahead": True})).action == "on-demand"
    # Told where spot is (the simulator's view), a return is never refused: its own rules.
    told = {**on_demand_now, "told": True}
    assert OWN_RULES(situation(zones=(ZoneView("zone-a", True, 0.25),), **told)).action == "spot"


def test_a_budget_that_would_be_exceeded_stops_the_job() -> None:
    # 3 h of work, 1 h restart, budget $5: on-demand ($12 to finish) is never taken; the first loss leaves
    # $2 spent and $3 to go on spot (exactly the budget): it waits for spot; the second loss would need
    # $4 + $2 = $6 > $5, so it stops with a checkpoint, having spent $4.
    run = hourly_run([[1, 1, 0, 1, 1, 0, 1, 1, 1, 1]], work=3, deadline=20, budget=5.0)
    shown, outcome = played(OWN_RULES, run)
    assert shown == "ss.ssX"
    assert outcome.stopped and outcome.finish is None and outcome.cost(run) == 4.0
    stop = outcome.choices[-1]
    assert str(stop.reason) == (
        "stopping with a checkpoint: the job would cost at least 6.00 in all, "
        "over the budget of 5.00 (4.00 spent so far)"
    )
    assert outcome.choices[2].reason.key == "spot-policy.wait.budget"
    # A budget that covers it changes nothing.
    free = hourly_run([[1, 1, 0, 1, 1, 0, 1, 1, 1, 1]], work=3, deadline=20)
    roomy = hourly_run([[1, 1, 0, 1, 1, 0, 1, 1, 1, 1]], work=3, deadline=20, budget=100.0)
    assert played(OWN_RULES, free)[0] == played(OWN_RULES, roomy)[0]


def test_without_a_deadline_the_job_goes_to_spot_as_it_always_did() -> None:
    choice = OWN_RULES(situation(zones=zones(False, True), time_left_s=None))
    assert (choice.action, choice.zone, choice.reason.key) == ("spot", "zone-b", "spot-policy.spot.no-deadline")
    assert greedy(situation(zones=zones(False), time_left_s=None)).action == "wait"
    # A job without a deadline that is on on-demand (a person's `resume … on-demand`) stays there.
    kept = OWN_RULES(situation(zones=zones(True), time_left_s=None, holding=Holding("on-demand")))
    assert (kept.action, kept.reason.key) == ("on-demand", "spot-policy.on-demand.kept")


def test_the_zone_with_the_best_recent_availability_is_taken_and_kept() -> None:
    views = (*zones(True, share=0.3), *zones(True, True, share=0.8)[1:])
    assert OWN_RULES(situation(zones=views)).zone == "zone-b"
    kept = OWN_RULES(situation(zones=views, holding=Holding("spot", "zone-a")))
    assert kept.zone == "zone-a"  # staying costs no start-up
    assert spot_only(situation(zones=views)).zone == "zone-a"  # the baseline goes by order
    assert OWN_RULES(situation(zones=views, holding=NOTHING)).action == "spot"


def test_every_policy_reason_is_a_catalogue_sentence_with_its_values() -> None:
    reasons = policy_reasons()
    every = set(WORDING.sentences) | set(job_options.WORDING.sentences)
    assert {reason.key for reason in reasons} == every
    for reason in reasons:
        assert str(reason) == reason.template.format(**reason.values)
