"""A gang that lost one node and cannot get its replacement: wait longer for that one node, or move the whole gang.

The survivors bill while they wait, so waiting is not free: each further stretch of waiting costs the survivors'
hours plus the chance that the node still does not come; moving costs a whole-gang restart (every node launched,
restored and warmed up again) but ends the wait. The bot asks this once the hold time is over, and again at each
further hold, so a gang never waits without a bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GangMove = Literal["wait", "move"]


@dataclass(frozen=True, slots=True)
class GangHold:
    """What the choice weighs, all from the job's record and the cloud's view."""

    nodes: int  # the gang's size
    survivors: int  # nodes still up, waiting (billing) for the lost one's replacement
    node_price_per_hour: float  # what one node pays now (spot or on-demand, whichever it runs on)
    waited_seconds: float  # how long the survivors have waited so far
    hold_seconds: float  # the configured hold: the next stretch the gang would wait
    replace_seconds: float  # one node's restart overhead (launch, image, restore, warm-up)
    move_seconds: float  # a whole gang's restart overhead elsewhere (every node launched, restored, warmed up)
    availability: float  # 0..1: the chance the lost node's replacement comes within the next hold
    slack_seconds: float | None = None  # time to the deadline less the work left; None: no deadline


def short_of_slack(slack_s: float | None, hold_s: float, move_s: float) -> bool:
    """Whether the deadline's slack (None: no deadline) would not cover one more hold and then a move: the gang must
    move now, where the spot authority can still put it on-demand in time."""
    return slack_s is not None and slack_s < hold_s + move_s


def wait_or_move(hold: GangHold) -> GangMove:
    """``move`` when the gang's expected cost of waiting one more hold exceeds that of moving now.

    Waiting: the survivors bill for the hold whatever happens; with chance ``availability`` the node comes and the
    gang pays one node's restart, else the gang is where it is now, a hold later (counted as one more hold). Moving:
    every node pays the whole gang's restart overhead. Both in node-hours at one price, so the price cancels out of
    the comparison; it stays in :class:`GangHold` for the accounting the card shows.

    A deadline bounds the waiting: when the slack left would not cover one more hold and a move's restart, the gang
    moves (where the spot authority can still put it on-demand in time). ``finetune-bot simulate`` showed why: on
    the 4-node traces with a 30-minute gang restart, holds that the cost comparison alone chose ran 3 of 96 jobs
    past their deadlines (bench/gang_recovery.py).
    """
    if hold.survivors <= 0:
        return "move"
    if short_of_slack(hold.slack_seconds, hold.hold_seconds, hold.move_seconds):
        return "move"
    hold_h = hold.hold_seconds / 3600
    replace_h = hold.replace_seconds / 3600
    move_h = hold.move_seconds / 3600
    p = min(max(hold.availability, 0.0), 1.0)
    wait_cost = hold.survivors * hold_h + p * hold.nodes * replace_h + (1 - p) * hold.nodes * (hold_h + move_h)
    move_cost = hold.nodes * move_h
    return "move" if wait_cost > move_cost else "wait"


GangRecovery = Literal["replace-one", "whole-gang"]

# Until the job has measured its own: a cloud's launch (request to host booted; 1-3 minutes for a GPU host), a fresh
# node's restore, and the survivors' regroup into the replacement's world (they read their regroup at the control
# poll and start their trainers again after the replacement is up; measured on the local cloud at 3-5 s, the gap
# between replace-one and whole-gang there, bench/gang_recovery_live.py).
DEFAULT_LAUNCH_SECONDS = 120.0
DEFAULT_LAUNCH_SPREAD_SECONDS = 60.0  # launches take 1-3 minutes: 120 s ± 60 s
DEFAULT_RESTORE_SECONDS = 60.0
DEFAULT_REGROUP_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class RecoveryTimes:
    """What a gang's recovery from one lost node costs, per fresh node, in seconds (measured, or the defaults)."""

    nodes: int
    launch_seconds: float  # one node launched alone: request to its runner up (boot, what a fresh host fetches)
    restore_seconds: float  # a fresh node's restore of the gang's checkpoint
    regroup_seconds: float = DEFAULT_REGROUP_SECONDS  # the survivors joining the replacement's world
    # Every node launched at once, to the slowest one's runner up (a gang waits for its slowest): the job's own
    # whole-gang launch where it measured one, else one launch per wave of the zone's capacity.
    gang_launch_seconds: float | None = None
    zone_capacity: int | None = None  # nodes a zone launches at once (None: as many as asked)
    measured: bool = False  # launch and restore are the job's own figures
    launch_spread_seconds: float = DEFAULT_LAUNCH_SPREAD_SECONDS  # launches take launch_seconds ± this

    def replace_one(self) -> float:
        """One node launched and restored while the survivors hold their state, then the regroup."""
        return self.launch_seconds + self.restore_seconds + self.regroup_seconds

    def whole_gang(self) -> float:
        """Every node launched and restored again, side by side, in waves of the zone's capacity; a gang waits for
        its slowest node, so each wave costs at least one node's launch."""
        if self.gang_launch_seconds is not None:
            return self.gang_launch_seconds + self.restore_seconds
        # The expected slowest of n launches spread evenly over launch ± spread: launch + spread × (n - 1) / (n + 1).
        slowest = self.launch_seconds + self.launch_spread_seconds * (self.nodes - 1) / (self.nodes + 1)
        waves = 1 if self.zone_capacity is None else -(-self.nodes // self.zone_capacity)
        return slowest + (waves - 1) * self.launch_seconds + self.restore_seconds


# A whole-gang restart gives up the survivors' instances and asks the zone for every node again (a spot zone may not
# have them all): it is chosen only where it is faster than replace-one by more than this share.
WHOLE_GANG_MARGIN = 0.1


def replace_or_restart(times: RecoveryTimes) -> GangRecovery:
    """``whole-gang`` only where restarting every node is clearly faster than replacing the lost one: where a launch
    costs less than the survivors' regroup (the local cloud's instant launches), not where it costs minutes."""
    faster = times.whole_gang() < (1 - WHOLE_GANG_MARGIN) * times.replace_one()
    return "whole-gang" if faster else "replace-one"
