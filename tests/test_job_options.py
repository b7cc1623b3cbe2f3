"""``deadline=`` and ``budget=`` on ``start``: job options taken out before the recipe sees its overrides."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from handlers.commands import parse
from handlers.errors import ReasonError
from handlers.job_options import (
    JobOptions,
    parse_budget,
    parse_deadline,
    parse_job_options,
    reserved_parameter,
    split_overrides,
)
from handlers.recipes import TINY

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("word", "span"),
    [
        ("36h", timedelta(hours=36)),
        ("90m", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("1d12h", timedelta(hours=36)),
        ("1.5H", timedelta(hours=1.5)),
        ("2026-03-05T09:00Z", datetime(2026, 3, 5, 9, 0, tzinfo=UTC) - NOW),
        ("2026-03-05T17:00+08:00", datetime(2026, 3, 5, 9, 0, tzinfo=UTC) - NOW),
    ],
)
def test_a_deadline_is_a_duration_from_now_or_a_moment_with_its_zone(word: str, span: timedelta) -> None:
    assert parse_deadline(word, NOW) == NOW + span


@pytest.mark.parametrize(
    ("word", "key"),
    [
        ("soon", "option.bad-deadline"),
        ("-3h", "option.bad-deadline"),
        ("3h30", "option.bad-deadline"),
        ("2026-03-05T09:00", "option.bad-deadline"),  # no zone: ambiguous
        ("5m", "option.deadline-range"),
        ("91d", "option.deadline-range"),
        ("2026-03-01T09:00Z", "option.deadline-range"),  # in the past
    ],
)
def test_a_bad_deadline_says_what_a_deadline_looks_like(word: str, key: str) -> None:
    with pytest.raises(ReasonError) as caught:
        parse_deadline(word, NOW)
    assert caught.value.reason.key == key


def test_a_budget_is_an_amount_in_the_account_currency() -> None:
    assert parse_budget("120") == 120.0 and parse_budget("99.50") == 99.5
    for word, key in (("1e3", "option.bad-budget"), ("12.345", "option.bad-budget"), ("0", "option.budget-range")):
        with pytest.raises(ReasonError) as caught:
            parse_budget(word)
        assert caught.value.reason.key == key


def test_start_with_a_deadline_and_a_budget_keeps_them_away_from_the_recipe() -> None:
    command = parse("start tiny deadline=36h steps=30 budget=120")
    with pytest.raises(ReasonError) as refused:  # the recipe alone would refuse them: they are not its parameters
        TINY.resolve(command.overrides)
    assert refused.value.reason.key == "recipe.no-parameter"
    options, overrides = split_overrides(command.overrides)
    assert overrides == {"steps": "30"} and TINY.resolve(overrides)["steps"] == 30
    assert parse_job_options(options, NOW) == JobOptions(deadline=NOW + timedelta(hours=36), budget=120.0)
    assert parse_job_options({}, NOW) == JobOptions()  # no deadline: the job behaves as it always did


def test_a_recipe_may_not_declare_a_parameter_named_like_a_job_option() -> None:
    error = reserved_parameter("mine", {"budget": 1, "lr": 2})
    assert error is not None and error.reason.values == {"recipe": "mine", "name": "budget"}
    assert reserved_parameter("tiny", TINY.parameters) is None


def test_nodes_and_efa_are_job_options_on_any_recipe_with_their_bounds() -> None:
    command = parse("start tiny nodes=2 nproc=2 efa=true steps=4")
    options, overrides = split_overrides(command.overrides)
    assert overrides == {"nproc": "2", "steps": "4"}  # nproc stays the recipe's: ranks per node
    assert parse_job_options(options, NOW) == JobOptions(nodes=2, efa=True)
    assert parse_job_options({"nodes": "64"}, NOW).nodes == 64
    # A gang plans spot against a deadline and a budget as one node does (the policy prices every node).
    both = parse_job_options({"nodes": "4", "deadline": "36h", "budget": "500"}, NOW)
    assert (both.nodes, both.deadline, both.budget) == (4, NOW + timedelta(hours=36), 500.0)
    for raw, key in (
        ({"nodes": "65"}, "option.bad-nodes"),
        ({"nodes": "0"}, "option.bad-nodes"),
        ({"nodes": "two"}, "option.bad-nodes"),
        ({"nodes": "-2"}, "option.bad-nodes"),
        ({"efa": "yes", "nodes": "2"}, "option.bad-efa"),
        ({"efa": "true"}, "option.efa-one-node"),
    ):
        with pytest.raises(ReasonError) as caught:
            parse_job_options(raw, NOW)
        assert caught.value.reason.key == key, raw
