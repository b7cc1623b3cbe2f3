"""Turn a job's next attempt into the runner's spec: the recipe's argv with the job's validated parameters."""

from __future__ import annotations

from typing import Literal

from handlers.jobs import Job
from handlers.recipes import Recipe
from handlers.spec import SPEC_VERSION, Gang, JobSpec


def build_spec(
    job: Job,
    attempt: int,
    recipe: Recipe,
    checkpoint_uri: str,
    report: list[str],
    notice: Literal["aws", "aliyun", "none"],
    python: str,
    gang: Gang | None = None,
) -> JobSpec:
    """``gang``: a gang node's place in its world (:func:`handlers.gang.place_in`); None for one node. The spec
    carries the attempt's key salt, from its record (the standby launched ahead's, or one of ``attempts``); a spec
    of an attempt the job never planned (a benchmark's argv) draws one of its own, which no bot knows."""
    ahead = job.standby is not None and job.standby.number == attempt
    planned = job.standby if ahead else job.attempt_numbered(attempt)
    salt = {"key_salt": planned.key_salt} if planned is not None else {}
    return JobSpec(
        version=SPEC_VERSION,
        job_id=job.id,
        attempt=attempt,
        command=recipe.argv(recipe.resolve_values(job.params), python),
        env=dict(recipe.env),
        checkpoint_uri=checkpoint_uri,
        report=report,
        notice=notice,
        gang=gang,
        hang=recipe.hang,
        **salt,
        # Launched ahead of a switch of market, or a gang's replacement launched while the survivors still commit.
        handover=(job.standby is not None and job.standby.number == attempt) or _replacement(job, attempt, gang),
    )


def _replacement(job: Job, attempt: int, gang: Gang | None) -> bool:
    """A fresh node of a gang whose survivors wait for their regroup: it waits for the bot's go before it restores,
    the go coming once every survivor has committed (``handlers.decide.gangs``)."""
    planned = job.attempt_numbered(attempt)
    if gang is None or planned is None or planned.next_rank is not None:
        return False
    return any(a.next_rank is not None and a.ended_at is None for a in job.attempts)
