"""The chat port the bot talks to: each note goes to the adapter of the platform its job was started from.

A job started from Slack is told about in Slack, one started from the console in the console; a platform with
no adapter configured (or a job with no chat at all) falls back to the console.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.chat.base import ChatPort
from handlers.jobs import Job
from handlers.messages import Notify


class ChatRouter:
    def __init__(self, routes: Mapping[str, ChatPort], fallback: ChatPort) -> None:
        self.routes = dict(routes)
        self.fallback = fallback

    def port_for(self, job: Job) -> ChatPort:
        platform = job.chat.platform if job.chat is not None else ""
        return self.routes.get(platform, self.fallback)

    async def notify(self, job: Job, note: Notify) -> None:
        await self.port_for(job).notify(job, note)
