"""Every decision about a job, as pure functions: (job, what happened, now) → Change.

The bus handler loads the job, calls :func:`decide` inside the store's transaction and commits the Change;
commands from chat call the ``*_command`` functions the same way. A module per kind of decision, each importing only
those below it (no cycle, no sibling's private name; ``tests/test_imports.py`` checks both):

- :mod:`~handlers.decide.dispatch`: :func:`decide`, which decision an input message gets;
- :mod:`~handlers.decide.commands`: start (:func:`new_job`), interrupt-test, ack, resume;
- :mod:`~handlers.decide.inputs`: a one-node job's reports, cloud events, launch results and timers;
- :mod:`~handlers.decide.gangs`: a gang's (``nodes`` > 1);
- :mod:`~handlers.decide.recovery`: an attempt that ended on its own: relaunched (bounded) or failed and paged;
- :mod:`~handlers.decide.steering`: the spot policy's choices, its tick, a switch of market (launched ahead or not);
- :mod:`~handlers.decide.stop`: a stop, a person's or the policy's for the budget;
- :mod:`~handlers.decide.launching`: attempts planned, launched, ended and released (one node or a gang);
- :mod:`~handlers.decide.builders`: the Change builders every decision uses.

Fencing: a report or event for an attempt other than the current one (a dying instance's late heartbeat, the old
instance's termination after a relaunch) never moves the job, as anything the transition table does not allow.
Fencing stops an old report from moving the job, not from being told: a late spot warning still alerts (once per
attempt: its notes have fixed ids, so the chat outbox posts whichever comes first and drops the other), and a late
checkpoint receipt is still posted. A launch result nobody wants any more (the job ended, or another attempt is
current) terminates its instance, so nothing bills unseen.
"""

from handlers.decide.builders import WORDING
from handlers.decide.commands import ack_command, interrupt_test_command, new_job, resume_command
from handlers.decide.dispatch import decide
from handlers.decide.stop import stop_command

__all__ = [
    "WORDING",
    "ack_command",
    "decide",
    "interrupt_test_command",
    "new_job",
    "resume_command",
    "stop_command",
]
