"""Every Redis key the bot, its executors and the local cloud use, under one prefix, in one place.

A reader looking for "where does X live in Redis" finds it here; a test keeps apart from every other test by
giving its own prefix. The queues, one per executor (each effect goes straight to the one that carries it out):

- ``events``: what happened (runner reports, cloud events, launch results, timers that fell due), read by the bot;
- ``chat``: notes to post, read by the chat outbox;
- ``cloud``: effects on the cloud (launch, terminate, interrupt-test, stop the runner), read by the cloud executor;
- ``timers``: a sorted set of messages scored by the time they fall due onto ``events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from handlers.jobs import JobState

DEFAULT_PREFIX = "finetune:"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    # -- the queues ---------------------------------------------------------------------------------------

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    @property
    def chat(self) -> str:
        return f"{self.prefix}chat"

    @property
    def cloud(self) -> str:
        return f"{self.prefix}cloud"

    @property
    def timers(self) -> str:
        return f"{self.prefix}timers"

    @staticmethod
    def parked(stream: str) -> str:
        """Where a stream's poison messages go."""
        return f"{stream}:parked"

    # -- the job store ------------------------------------------------------------------------------------

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def state(self, state: JobState) -> str:
        return f"{self.prefix}state:{state.value}"

    @property
    def instances(self) -> str:
        """Hash: instance id -> job id, for every attempt of every job."""
        return f"{self.prefix}instances"

    @property
    def restarts(self) -> str:
        """Hash: "recipe|instance type" -> the restart overhead its jobs measured, in seconds (restart.py)."""
        return f"{self.prefix}restarts"

    @staticmethod
    def restart_measured(job_id: str, attempt: int) -> str:
        """Under :meth:`dedup`: an attempt's restart overhead went into the estimate (once per attempt)."""
        return f"restart:{job_id}:{attempt}"

    def history(self, job_id: str) -> str:
        return f"{self.prefix}history:{job_id}"

    def chart(self, job_id: str) -> str:
        """Sorted set: the job's (step, loss, time, attempt) points for its chart, scored by step, bounded
        (bot/charts/series.py); deleted with the job."""
        return f"{self.prefix}chart:{job_id}"

    def chart_stride(self, job_id: str) -> str:
        """The step stride of :meth:`chart` (one point per stride of steps; doubled whenever the points overflow)."""
        return f"{self.prefix}chart-stride:{job_id}"

    @property
    def created(self) -> str:
        """Sorted set: every stored job's id, scored by when it was created (``list`` for admins reads its tail)."""
        return f"{self.prefix}jobs:created"

    def channel_jobs(self, platform: str, channel: str) -> str:
        """Sorted set: the ids of the jobs started in one channel, scored by creation (``list`` reads its tail)."""
        return f"{self.prefix}jobs:channel:{platform}:{channel}"

    @property
    def ended(self) -> str:
        """Sorted set: jobs in a final state, scored by when they reached it (the retention sweep reads its head)."""
        return f"{self.prefix}jobs:ended"

    def dedup(self, key: str) -> str:
        """Once-only markers with a TTL (:meth:`bot.store.JobStore.claim_once`), named by the helpers below."""
        return f"{self.prefix}dedup:{key}"

    @staticmethod
    def input_seen(message_id: str) -> str:
        """Under :meth:`dedup`: an events-stream message applied to its job; a redelivery changes nothing."""
        return f"in:{message_id}"

    @staticmethod
    def slack_request(digest: str) -> str:
        """Under :meth:`dedup`: one Slack request, however often Slack retries it or anyone replays it."""
        return f"slack:{digest}"

    @staticmethod
    def dingtalk(key: str) -> str:
        """Under :meth:`dedup`: DingTalk's inbound messages and its delivery ledger."""
        return f"dingtalk:{key}"

    @staticmethod
    def reconciled(what: str) -> str:
        """Under :meth:`dedup`: one thing a reconciliation round did (an orphan released in a window, a silence
        noted), so another round or replica does not do it again."""
        return f"reconcile:{what}"

    @property
    def audit(self) -> str:
        """Capped stream: what people did (commands that were carried out, and what concerns no job)."""
        return f"{self.prefix}audit"

    @property
    def refusals(self) -> str:
        """Capped stream: refused commands, apart from :attr:`audit` so a flood of them cannot roll actions out."""
        return f"{self.prefix}audit:refused"

    def rate(self, bucket: str, user: str) -> str:
        """Hash: one user's token bucket (``commands`` or ``starts``), shared by every replica (bot/rate_limit.py)."""
        return f"{self.prefix}rate:{bucket}:{user}"

    def effect_done(self, effect_id: str) -> str:
        """The record of an effect the cloud executor carried out (its follow-up was committed with it)."""
        return f"{self.prefix}effect:{effect_id}"

    # -- chat -----------------------------------------------------------------------------------------------

    def sent(self, note_id: str) -> str:
        return f"{self.prefix}chat:sent:{note_id}"

    def sending(self, note_id: str) -> str:
        """Set before a note's first delivery: a later try knows an earlier one may have gone through."""
        return f"{self.prefix}chat:sending:{note_id}"

    def card(self, job_id: str) -> str:
        return f"{self.prefix}chat:card:{job_id}"

    def pages(self, job_id: str) -> str:
        return f"{self.prefix}chat:pages:{job_id}"

    @property
    def card_marks(self) -> str:
        return f"{self.prefix}chat:card-marks"

    def card_throttle(self, job_id: str) -> str:
        return f"{self.prefix}chat:card-throttle:{job_id}"

    def card_posting(self, job_id: str) -> str:
        return f"{self.prefix}chat:card-posting:{job_id}"

    # -- reconciliation ---------------------------------------------------------------------------------------

    @property
    def reconcile_lock(self) -> str:
        """Held (with a TTL) by the one replica running a reconciliation round; its value names that replica."""
        return f"{self.prefix}reconcile:lock"

    @property
    def reconcile_last(self) -> str:
        """When the last reconciliation round ended (POSIX seconds): the replicas share one period between them."""
        return f"{self.prefix}reconcile:last"

    # -- storage credentials (AWS with a runner storage role) ---------------------------------------------------

    @property
    def renewal_lock(self) -> str:
        """Held (with a TTL) by the one replica rewriting the live attempts' storage credentials."""
        return f"{self.prefix}storage-renewal:lock"

    @property
    def renewal_last(self) -> str:
        """When the last renewal round began (POSIX seconds, the bot's clock): the replicas share one period."""
        return f"{self.prefix}storage-renewal:last"

    # -- replicas and the local cloud -------------------------------------------------------------------------

    @property
    def replicas(self) -> str:
        """Sorted set: each live replica's runner-report URL, scored by when its registration lapses."""
        return f"{self.prefix}replicas"

    @property
    def local_instances(self) -> str:
        """Set: the id of every instance the local cloud ever started (live or gone)."""
        return f"{self.prefix}local:instances"

    def local_instance(self, instance_id: str) -> str:
        """Hash: one local instance's record (state, control endpoint, job and attempt, prices)."""
        return f"{self.prefix}local:instance:{instance_id}"

    @property
    def local_no_spot(self) -> str:
        """Set: the local cloud's zones without spot capacity now (a test takes it away, and gives it back)."""
        return f"{self.prefix}local:no-spot"

    def local_owner(self, instance_id: str) -> str:
        """Held by the one process that is this local instance: a second launch of the same attempt backs off."""
        return f"{self.prefix}local:owner:{instance_id}"


DEFAULT_KEYS = Keys()
