"""Every reason the spot policy can give (``spot-policy.*``, ``gang.*``): its English sentences by key.

A table of words, not of policies: the thread's note (:class:`handlers.notes.SpotPolicyNote` takes only these keys)
and the chat catalogue import it without loading the policies (:mod:`handlers.spot`), which word their choices
from it.
"""

from __future__ import annotations

from handlers.reasons import Wording

WORDING = Wording(
    {
        # the rules' (handlers/spot/rules.py)
        "spot-policy.on-demand.deadline": "on-demand now: {work_h:g} h of work left, {left_h:g} h to the deadline",
        "spot-policy.on-demand.pace": (
            "on-demand now: no zone has spot and {work_h:g} h of work left is behind an even pace "
            "to the deadline in {left_h:g} h"
        ),
        "spot-policy.on-demand.reserve": (
            "on-demand now: no zone has spot, and the slack left ({slack_h:g} h) is kept for later outages"
        ),
        "spot-policy.on-demand.only": "on-demand: this job's policy uses no spot",
        "spot-policy.on-demand.kept": "staying on on-demand: the job has no deadline to plan a return to spot by",
        "spot-policy.spot": "spot in {zone}: {slack_h:g} h of slack before the deadline",
        "spot-policy.spot.back": "back to spot in {zone}: {slack_h:g} h of slack leaves room for another restart",
        "spot-policy.spot.only": "spot in {zone}: this job's policy uses spot only",
        "spot-policy.spot.no-deadline": "spot in {zone}: the job has no deadline",
        "spot-policy.spot.budget": "spot in {zone}: on-demand would go over the budget of {budget:.2f}",
        "spot-policy.wait": "waiting for spot: no zone has capacity and {slack_h:g} h of slack remain",
        "spot-policy.wait.only": "waiting for spot: no zone has capacity (this job's policy uses spot only)",
        "spot-policy.wait.budget": "waiting for spot: on-demand would go over the budget of {budget:.2f}",
        "spot-policy.late": (
            "the deadline can no longer be met ({work_h:g} h of work left, {left_h:g} h to the deadline): "
            "finishing as soon as possible"
        ),
        "spot-policy.stop.budget": (
            "stopping with a checkpoint: the job would cost at least {need:.2f} in all, "
            "over the budget of {budget:.2f} ({spent:.2f} spent so far)"
        ),
        # spot-first's (handlers/spot/policies.py)
        "spot-policy.spot.first": "spot in {zone}: spot first, on-demand only once spot has no room anywhere",
        "spot-policy.on-demand.first": "on-demand now: no zone has spot capacity",
        # a job with no measured step yet (handlers/spot/situation.py)
        "spot-policy.unmeasured": "spot in {zone}: no step is measured yet to plan by",
        "spot-policy.unmeasured.on-demand": "on-demand: no zone has spot, and no step is measured yet to plan by",
        "spot-policy.unmeasured.wait": "waiting for spot: no zone has capacity, and no step is measured yet",
        # a gang's lost node (handlers/spot/gang.py)
        "gang.hold": (
            "node {node}'s replacement has no capacity in {zone}: the other nodes stand by (billing) for up to "
            "{minutes} min, then the policy chooses between waiting longer and moving the whole gang"
        ),
        "gang.move": (
            "node {node}'s replacement still had no capacity in {zone} after {minutes} min: the whole gang moves "
            "elsewhere, from its newest complete checkpoint"
        ),
        # a gang's recovery from a lost node (handlers/decide/gang_recovery.py)
        "gang.replace-one": (
            "replacing the lost node alone: about {replace_s} s to train again (a launch of {launch_s} s and a "
            "restore of {restore_s} s while the others hold), against {whole_s} s for all {nodes} nodes again"
        ),
        "gang.whole-gang": (
            "restarting all {nodes} nodes: about {whole_s} s to train again, against {replace_s} s for the lost "
            "node alone (launches here take {launch_s} s, less than the others' regroup)"
        ),
        "gang.replace-one.default": (
            "replacing the lost node alone: about {replace_s} s to train again against {whole_s} s for all "
            "{nodes} nodes (a cloud's launch and restore times: this job has not measured its own yet)"
        ),
        "gang.whole-gang.default": (
            "restarting all {nodes} nodes: about {whole_s} s to train again against {replace_s} s for the lost "
            "node alone (a cloud's launch and restore times: this job has not measured its own yet)"
        ),
    }
)

# The keys a spot-policy note may carry.
POLICY_REASONS = frozenset(WORDING.sentences)
