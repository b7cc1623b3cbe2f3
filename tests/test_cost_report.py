"""The costs report as a pure function of job records and a clock: which jobs a window holds, the sums by team,
user and recipe, savings only over the jobs with a counterfactual; the command's grammar; who may see what."""

from __future__ import annotations

from datetime import timedelta

import pytest

from handlers.commands import Command, parse
from handlers.cost_report import NO_TEAM, active_in, cost_report, report_json
from handlers.errors import ReasonError
from handlers.jobs import JobState
from handlers.permissions import cost_refusal, cost_teams
from handlers.policy_config import PolicyConfig, Team
from tests.cost_jobs import ADMIN, ALICE, BOB, CAROL, NOW, TINA, week_of_jobs

POLICY = PolicyConfig(
    admins=[ADMIN],
    teams={"ml": Team(members=[ALICE, TINA]), "vision": Team(members=[BOB])},
)


def test_a_week_holds_the_jobs_active_in_it_with_their_sums_by_team_user_and_recipe() -> None:
    report = cost_report(week_of_jobs(), "7d", NOW)
    assert [row.job for row in report.jobs] == ["ft-aaaa", "ft-bbbb", "ft-cccc", "ft-eeee"]  # ft-dddd ended before
    assert report.start == NOW - timedelta(days=7) and report.teams is None
    total = report.total
    assert (total.jobs, round(total.paid, 2), round(total.on_demand, 2)) == (4, 6.91, 22.0)
    assert round(total.compared_paid, 2) == 6.61 and round(total.saved, 2) == 15.39  # carol's job is not compared
    assert (total.steps_lost, round(total.lost_hours, 2), total.restarts, total.restart_hours) == (20, 0.2, 1, 0.5)
    assert list(report.by_team) == ["ml", "vision", NO_TEAM]  # the biggest spender first
    ml = report.by_team["ml"]
    assert (ml.jobs, round(ml.paid, 2), round(ml.on_demand, 2), ml.steps_lost) == (2, 5.08, 16.9, 20)
    assert report.by_team[NO_TEAM].savings is None
    assert {user: spend.jobs for user, spend in report.by_user.items()} == {ALICE: 1, TINA: 1, BOB: 1, CAROL: 1}
    assert {recipe: round(s.paid, 2) for recipe, s in report.by_recipe.items()} == {"tiny": 4.86, "deepseek-7b": 2.05}


def test_each_zone_it_ran_in_shows_what_was_billed_there_and_names_its_region() -> None:
    """tina's job moved from us-east-1a (2.1 h at $0.50) to us-west-2b (2.0 h at $0.50): each zone holds its own
    attempt's bill; jobs whose attempts say no zone (the rest of the week) are in no zone."""
    jobs = week_of_jobs()
    moved = jobs[1]
    first, second = moved.attempts
    zoned = [first.model_copy(update={"zone": "us-east-1a"}), second.model_copy(update={"zone": "us-west-2b"})]
    jobs[1] = moved.model_copy(update={"attempts": zoned})
    report = cost_report(jobs, "7d", NOW)
    assert list(report.by_zone) == ["us-east-1a", "us-west-2b"]  # the bigger bill first
    east, west = report.by_zone.values()
    assert (east.jobs, round(east.paid, 2), round(east.hours, 2)) == (1, 1.05, 2.1)
    assert (west.jobs, round(west.paid, 2), round(west.hours, 2)) == (1, 1.0, 2.0)
    assert round(east.paid + west.paid, 2) == round(report.by_user[TINA].paid, 2)  # the job's bill, split
    data = report_json(report)
    assert data["by_zone"]["us-west-2b"] == {"jobs": 1, "paid": 1.0, "hours": 2.0}
    assert [row["zones"] for row in data["jobs"]] == [[], ["us-east-1a", "us-west-2b"], [], []]


def test_the_window_moves_with_the_clock_and_thirty_days_hold_the_older_job() -> None:
    later = cost_report(week_of_jobs(), "7d", NOW + timedelta(days=4))
    assert [row.job for row in later.jobs] == ["ft-bbbb", "ft-cccc", "ft-eeee"]  # alice's ended 5.6 days before
    month = cost_report(week_of_jobs(), "30d", NOW)
    assert [row.job for row in month.jobs] == ["ft-dddd", "ft-aaaa", "ft-bbbb", "ft-cccc", "ft-eeee"]


def test_a_running_job_counts_and_one_created_after_the_window_does_not() -> None:
    running = week_of_jobs()[0].model_copy(update={"state": JobState.RUNNING, "updated_at": NOW - timedelta(days=30)})
    assert active_in(running, NOW - timedelta(days=7), NOW)
    future = running.model_copy(update={"created_at": NOW + timedelta(hours=1)})
    assert not active_in(future, NOW - timedelta(days=7), NOW)


def test_limited_to_teams_leaves_the_others_and_the_jobs_of_no_team_out() -> None:
    report = cost_report(week_of_jobs(), "7d", NOW, teams=["vision"])
    assert [row.job for row in report.jobs] == ["ft-cccc"] and report.teams == ("vision",)
    data = report_json(report)
    assert data["total"] == {
        "jobs": 1,
        "paid": 1.53,
        "on_demand": 5.1,
        "compared_paid": 1.53,
        "saved": 3.57,
        "savings": 0.7,
        "steps_lost": 0,
        "lost_hours": 0.0,
        "restarts": 0,
        "restart_hours": 0.0,
        "egress": 0.0,
    }
    assert data["jobs"][0]["job"] == "ft-cccc" and data["jobs"][0]["user"] == BOB


def test_costs_parses_a_window_and_a_team_and_refuses_anything_else() -> None:
    assert parse("costs") == Command("costs", window="7d")
    assert parse("costs 30D team=ml") == Command("costs", window="30d", team="ml")
    assert parse("costs team=ml 7d") == Command("costs", window="7d", team="ml")
    for bad in ("costs 90d", "costs 7d 30d", "costs team=a team=b", "costs team=", "costs team=a;b", "costs ml"):
        with pytest.raises(ReasonError, match="costs takes a window"):
            parse(bad)


def test_a_member_sees_their_team_an_admin_every_team_and_nobody_else_anything() -> None:
    assert cost_refusal(POLICY, ALICE, None) is None and cost_teams(POLICY, ALICE, None) == ("ml",)
    assert cost_refusal(POLICY, ALICE, "ml") is None and cost_teams(POLICY, ALICE, "ml") == ("ml",)
    assert (
        str(cost_refusal(POLICY, ALICE, "vision")) == "the costs of vision are shown to its members and the admins only"
    )
    assert (
        str(cost_refusal(POLICY, CAROL, None))
        == "costs are shown to a team's members and the admins; you are on no team"
    )
    assert cost_refusal(POLICY, ADMIN, None) is None and cost_teams(POLICY, ADMIN, None) is None
    assert cost_teams(POLICY, ADMIN, "vision") == ("vision",)
    assert str(cost_refusal(POLICY, ADMIN, "nope")) == "there is no team nope"
