"""The spot authority: one place decides where a job's next stretch runs (spot in which zone, on-demand, wait, or
stop), and nothing else does: no cloud provider changes zone or market by itself.

- :mod:`handlers.spot.situation`: the live decision (a job's record and the cloud's view as a Situation, the
  named policy's choice, what the card shows of it);
- :mod:`handlers.spot.steer`: what the decision means for the job (the next stretch's market and zone, the plan
  on the card, the reason in the thread), which :mod:`handlers.decide` turns into effects;
- :mod:`handlers.spot.policies`: the named policies (``spot-first``, the default of a job nobody steers, and the
  simulator's ``deadline-aware``, ``greedy``, ``spot-only``, ``on-demand``);
- :mod:`handlers.spot.zones`: the order of (zone, type) candidates within a launch, each cloud's capacity error
  codes, and live availability (AWS placement scores, Alibaba's stock) as the 0..1 signal the policy weighs;
- the policies' arithmetic and the simulator's model: :mod:`handlers.spot.rules`, :mod:`handlers.spot.simulator`.
"""

from handlers.spot.policies import POLICIES, SPOT_FIRST, policy_for, spot_first
from handlers.spot.rules import DEFAULT_POLICY, Choice, Event, Situation, ZoneView
from handlers.spot.situation import Regions, SpotView, choose, estimated_availability, managed, policy_of, steers

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "SPOT_FIRST",
    "Choice",
    "Event",
    "Regions",
    "Situation",
    "SpotView",
    "ZoneView",
    "choose",
    "estimated_availability",
    "managed",
    "policy_for",
    "policy_of",
    "spot_first",
    "steers",
]
