"""The local cloud's timeline under a profile (:mod:`bot.cloud.local.profile`): where a launch's profile time goes.

A launch returns as soon as its instance is registered (a cloud's launch call returns while the host still boots),
and the instance holds its runner for the boot the profile gives it. On the wall clock a test of a two-minute boot
would wait two minutes, so the boot is held ``boot × time_scale`` of wall time, and this clock, the wall clock plus
an offset, moves on once a boot is over to at least that boot's start plus its profile seconds (never back). Boots
that overlap share their jump, as hosts booting side by side do; a boot that starts when another ended adds its
own. With ``time_scale`` 1 it is the wall clock. A recovery's span on this clock is what this machine really spent
plus the profile's boots on its critical path: the figure tests and benches compare, never the wall clock's.

Which boot a launch gets: a profile's launches take ``launch_seconds ± launch_spread_seconds``, and a gang waits
for its slowest node. The local cloud gives the k-th node booting at once in a zone the expected slowest of k
draws from that range, ``low + (high - low) × k / (k + 1)``: one replacement gets the middle, the last node of a
whole gang its gang's expected slowest, and the same launches always get the same boots. A gang's nodes of one
generation are one launch on a cloud (node 0's call returns while it boots, and the others follow at once), so they
count as booting together whatever the wall clock did between the bot's calls: on a busy machine a second between
two launch calls outlasts a boot held 0.5 % of its time, and the gang would otherwise boot one node at a time. A zone
boots at most ``zone_capacity`` nodes at once; a further one starts its boot when the earliest of those ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.cloud.local.profile import LocalProfile


@dataclass(frozen=True, slots=True)
class Boot:
    zone: str
    wall_end: float  # when its hold ends on the wall clock
    start: float  # on the profile's timeline
    end: float  # on the profile's timeline


class ProfileClock:
    def __init__(self, profile: LocalProfile, wall: Callable[[], float] = time.time) -> None:
        self.profile = profile
        self._wall = wall
        self.offset = 0.0  # seconds the profile's boots ran ahead of the wall clock
        self._boots: list[Boot] = []
        self._launched: dict[str, int] = {}  # nodes booted so far per launch group (a gang's generation)

    def now(self) -> float:
        """Seconds since the epoch on the profile's timeline."""
        wall = self._wall()
        for boot in [b for b in self._boots if b.wall_end <= wall]:
            self.offset = max(self.offset, boot.end - boot.wall_end)
        self._boots = [b for b in self._boots if b.wall_end > wall or b.end > wall + self.offset]
        return wall + self.offset

    def boot(self, zone: str, group: str | None = None) -> float:
        """A new node's boot in ``zone`` (profile seconds, its wait for a slot included), from now on. ``group``: the
        launch it is part of (a gang's generation), whose earlier nodes count as booting beside it."""
        profile = self.profile
        start = self.now()
        booting = sorted(b.end for b in self._boots if b.zone == zone and b.end > start)
        begins = start
        capacity = profile.zone_capacity
        if capacity is not None and len(booting) >= capacity:
            begins = booting[len(booting) - capacity]  # a slot frees when the earliest of the last ``capacity`` ends
        together = self._launched.get(group, 0) if group is not None else 0
        if group is not None:
            self._launched[group] = together + 1
        k = 1 + max(sum(1 for end in booting if end > begins), together)
        low = max(profile.launch_seconds - profile.launch_spread_seconds, 0.0)
        high = profile.launch_seconds + profile.launch_spread_seconds
        seconds = begins - start + low + (high - low) * k / (k + 1) + profile.fetch_seconds()
        if profile.instant:
            return 0.0
        wall = self._wall()
        self._boots.append(Boot(zone, wall + seconds * profile.time_scale, start, start + seconds))
        return seconds
