"""``finetune-bot check``: is this set-up ready for its first job? One :class:`~bot.checks.result.Check` per thing
looked at (the configuration, Redis, the cloud's credentials, region and permissions, the event sources, the chat
tokens), printed one line each by :mod:`bot.checks.report`. ``serve`` runs the set that needs none of its own
servers before it starts (:func:`bot.checks.run.start_checks`), and refuses a cloud without credentials, a region or
an event source.

The cloud-specific probes live in each cloud's package (``bot/cloud/aws/probe.py``, ``aliyun/probe.py``,
``local/probe.py``), the chat platforms' in theirs; this package only gathers them.
"""
