"""Local stand-ins that the tests and the bench scripts share: the fake Slack and DingTalk servers (real signing,
real HTTP), the bot harness that runs the real service in-process, the two-replica chaos cluster, a restartable
Valkey and the notes the handlers write.

Its own package because ``bench`` never imports ``tests`` (DESIGN.md): both import these from here.
"""
