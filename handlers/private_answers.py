"""Which answers are for the asker alone, where a chat would otherwise show them to everyone in the group.

Slack shows every command's answer to its caller only (``chat.postEphemeral``); DingTalk has no such answer in a
group, so the adapter asks this first and sends these through the robot's one-to-one message instead (or refuses
them in the group): ``costs`` (what each user spent), ``logs`` (the trainer's log tail), ``history`` (the job's) and
an admin's ``list`` (or ``status`` without a job: the same list), which shows every channel's jobs, not just the
group's. Anything else, and a command that does not parse (its answer is the usage line), stays in the group.
"""

from __future__ import annotations

from handlers.commands import parse
from handlers.errors import ReasonError
from handlers.permissions import is_admin
from handlers.policy_config import PolicyConfig


def answered_privately(policy: PolicyConfig, user: str, text: str) -> bool:
    """Whether ``user``'s command ``text`` (what follows ``/finetune``) has an answer for ``user`` alone."""
    try:
        command = parse(text)
    except ReasonError:
        return False
    if command.action in ("costs", "logs", "history"):
        return True
    lists = command.action == "list" or (command.action == "status" and command.job_id is None)
    return lists and is_admin(policy, user)
