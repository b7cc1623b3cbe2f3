"""What the thread hears when a gang's lost node cannot be replaced: the hold, then the move (spot-policy notes).

The spot policy's own reasons (:class:`handlers.notes.SpotPolicyNote` takes only those), kept apart from the hold's
arithmetic in :mod:`handlers.spot.gang`.
"""

from __future__ import annotations

from handlers.reasons import Wording

WORDING = Wording(
    {
        "gang.hold": (
            "node {node}'s replacement has no capacity in {zone}: the other nodes stand by (billing) for up to "
            "{minutes} min, then the policy chooses between waiting longer and moving the whole gang"
        ),
        "gang.move": (
            "node {node}'s replacement still had no capacity in {zone} after {minutes} min: the whole gang moves "
            "elsewhere, from its newest complete checkpoint"
        ),
    }
)
