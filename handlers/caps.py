"""The caps that bound what a member can spend: a job's nodes, the nodes that run at once, a job's price an hour.

Caps ship on: with nothing configured a job has at most its recipe's ``max_nodes`` (1 unless the recipe says more)
and each team at most ``policy.max_concurrent_nodes`` (5) nodes at once. Nodes are what is counted, because every
node of a gang is an instance that bills: five one-node jobs and one five-node job weigh the same.

Nodes are counted against a *group*: the job's team (``team:<name>``), or, for a job of no team, its starter
(``user:<id>``, a team of one under the default team cap), so a person on no team can neither spend without limit
nor use up a team's room. ``policy.max_total_nodes`` (when set) bounds all groups together. The price cap is a
job's hourly price over all its nodes. An admin lifts any of them for one team in ``policy.teams.<name>``
(``max_nodes``, ``max_concurrent_nodes``, ``max_hourly_price``); each refusal names the limit and who can change it.

The concurrency count itself is taken in the store's write (``bot/store.py``), so concurrent starts never pass a
cap together; this module holds the caps in force and the words, as pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from handlers.policy_config import PolicyConfig
from handlers.reasons import Reason, Wording

WORDING = Wording(
    {
        "cap.nodes": (
            "{nodes} nodes is more than the {limit} a job of {recipe} may have in team {team}; "
            "an admin can raise policy.teams.{team}.max_nodes"
        ),
        "cap.nodes-no-team": (
            "{nodes} nodes is more than the {limit} a job of {recipe} may have; an admin can raise the "
            "recipe's max_nodes, or put you on a team with a higher max_nodes"
        ),
        "cap.team-nodes": (
            "team {team} runs {active} of its {limit} concurrent nodes, so {nodes} more do not fit; stop a job, "
            "or ask an admin to raise policy.teams.{team}.max_concurrent_nodes"
        ),
        "cap.own-nodes": (
            "you run {active} of the {limit} concurrent nodes of a person on no team, so {nodes} more do not fit; "
            "stop a job, or ask an admin to raise policy.max_concurrent_nodes or to put you on a team"
        ),
        "cap.total-nodes": (
            "all teams together run {active} of the {limit} nodes allowed at once, so {nodes} more do not fit; "
            "an admin can raise policy.max_total_nodes"
        ),
        "cap.price": (
            "${price:.2f}/h for {nodes} node(s) is above team {team}'s cap of ${cap:.2f}/h; "
            "an admin can raise policy.teams.{team}.max_hourly_price"
        ),
        "cap.price-no-team": (
            "${price:.2f}/h for {nodes} node(s) is above the cap of ${cap:.2f}/h; "
            "an admin can raise policy.max_hourly_price"
        ),
    }
)

# The settings a refusal names, as an admin types them into the config (the words stay as they are in every language).
SETTINGS = (
    "policy.max_concurrent_nodes",
    "policy.max_total_nodes",
    "policy.max_hourly_price",
    "policy.teams.<team>.max_nodes",
    "policy.teams.<team>.max_concurrent_nodes",
    "policy.teams.<team>.max_hourly_price",
)

Full = Literal["group", "total"]  # which concurrency cap a start would pass: its group's, or all groups'


@dataclass(frozen=True, slots=True)
class Caps:
    """The caps in force for one job: counted against ``group``; ``team`` None for a job of no team."""

    group: str
    team: str | None
    max_nodes: int
    max_concurrent_nodes: int
    max_total_nodes: int | None
    max_hourly_price: float | None


def cap_group(team: str | None, user: str) -> str:
    """Whom a job's nodes are counted against: its team, else its starter alone."""
    return f"team:{team}" if team is not None else f"user:{user}"


def caps_for(policy: PolicyConfig, recipe_max_nodes: int, team: str | None, user: str) -> Caps:
    """The caps of a job of ``team`` (None: of no team) started by ``user`` on a recipe allowing
    ``recipe_max_nodes``: the team's own overrides where an admin set them, else the policy's defaults."""
    own = policy.teams.get(team) if team is not None else None
    max_nodes = own.max_nodes if own is not None and own.max_nodes is not None else recipe_max_nodes
    concurrent = policy.max_concurrent_nodes
    if own is not None and own.max_concurrent_nodes is not None:
        concurrent = own.max_concurrent_nodes
    price = own.max_hourly_price if own is not None and own.max_hourly_price is not None else policy.max_hourly_price
    return Caps(
        group=cap_group(team, user),
        team=team,
        max_nodes=max_nodes,
        max_concurrent_nodes=concurrent,
        max_total_nodes=policy.max_total_nodes,
        max_hourly_price=price,
    )


def nodes_refusal(caps: Caps, recipe: str, nodes: int) -> Reason | None:
    """Why a job of ``nodes`` nodes is too big, or None."""
    if nodes <= caps.max_nodes:
        return None
    if caps.team is None:
        return WORDING("cap.nodes-no-team", nodes=nodes, limit=caps.max_nodes, recipe=recipe)
    return WORDING("cap.nodes", nodes=nodes, limit=caps.max_nodes, recipe=recipe, team=caps.team)


def price_refusal(caps: Caps, hourly_price: float | None, nodes: int) -> Reason | None:
    """Why a job costing ``hourly_price`` an hour (all its nodes together; None: not known) is too dear, or None."""
    cap = caps.max_hourly_price
    if cap is None or hourly_price is None or hourly_price <= cap:
        return None
    if caps.team is None:
        return WORDING("cap.price-no-team", price=hourly_price, nodes=nodes, cap=cap)
    return WORDING("cap.price", price=hourly_price, nodes=nodes, cap=cap, team=caps.team)


def concurrency_full(caps: Caps, group_active: int, total_active: int, nodes: int) -> Full | None:
    """Which concurrency cap ``nodes`` more nodes would pass, with ``group_active`` of the job's group and
    ``total_active`` of all groups running (the job's own nodes not counted), or None when they fit."""
    if group_active + nodes > caps.max_concurrent_nodes:
        return "group"
    if caps.max_total_nodes is not None and total_active + nodes > caps.max_total_nodes:
        return "total"
    return None


def concurrency_refusal(caps: Caps, full: Full, active: int, nodes: int) -> Reason:
    """The words for :func:`concurrency_full`'s answer; ``active``: the nodes running in the cap that is full."""
    if full == "total":
        return WORDING("cap.total-nodes", active=active, limit=caps.max_total_nodes, nodes=nodes)
    if caps.team is None:
        return WORDING("cap.own-nodes", active=active, limit=caps.max_concurrent_nodes, nodes=nodes)
    return WORDING("cap.team-nodes", team=caps.team, active=active, limit=caps.max_concurrent_nodes, nodes=nodes)
