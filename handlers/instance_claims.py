"""Whether a runner's claim about its instance may stand: the pure check behind ``started.instance_id``.

The instance of an attempt is the one the bot launched for it (the ``launched`` message, from the provider, which
finds it by the tags it put on it, in Auto Scaling and scaling-group modes too). A runner's report only confirms
it: a ``started`` naming another instance is not believed (the report is ignored, and the history says why), so no
report can point the job, and later its terminate, at an instance that is not the job's.
"""

from __future__ import annotations

from handlers.jobs import Attempt


def foreign_instance(attempt: Attempt, claimed: str | None) -> str | None:
    """Why a report naming ``claimed`` must be ignored for ``attempt``, or None when it may stand (it names no
    instance, the attempt's own, or the attempt's instance is not known yet: then the claim is not taken either)."""
    if claimed is None or attempt.instance_id is None or claimed == attempt.instance_id:
        return None
    return f"it names instance {claimed}, but attempt {attempt.number} runs on {attempt.instance_id}"
