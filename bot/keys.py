"""Every Redis key the bot, its executors and the local cloud use, under one prefix, in one place.

A reader looking for "where does X live in Redis" finds it here; a test keeps apart from every other test by
giving its own prefix. The queues, one per executor (each effect goes straight to the one that carries it out):

- ``events``: what happened (runner reports, cloud events, launch results, timers that fell due), read by the bot;
- ``chat``: notes to post, read by the chat outbox;
- ``cloud``: effects on the cloud (launch, terminate, interrupt-test, stop the runner), read by the cloud executor;
- ``timers``: a sorted set of messages scored by the time they fall due onto ``events``.

**Partitions (one Redis, or a Redis / Valkey cluster).** Everything a job's atomic write touches lives in one
*partition*, a hash tag ``{p<k>}`` after the prefix (``finetune:{p3}:job:<id>``), so every key of one script or
pipeline hashes to one cluster slot. A store of one partition (a single server has no slots) names its keys
without tags. A job's
partition is fixed by its id (:meth:`Keys.partition_of`, CRC-32 of the id modulo the count); the count is fixed
when the store is created and recorded in Redis (:attr:`layout`, see :mod:`bot.partitions`): one on a single server,
sixteen on a cluster by default. Per partition there are:

- the job records, their history streams, the dedup keys of the inputs applied to them, the records of the
  effects carried out for them (:meth:`effect_done`);
- the queues (events, chat, cloud, timers): a job's outbox goes to its own partition's queues in the script that
  changes it; consumers read every partition (one consumer group per partition stream, :mod:`bot.bus_set`);
- the indexes over jobs: the state sets, instance -> job, creation, per channel, ended.

The indexes that cross jobs are split the same way, so no script needs two slots: the instance index is a hash
per partition written with the job (a lookup asks every partition, one pipelined read); the state sets and the
creation, channel and ended indexes are per partition too (a listing reads every partition and merges); the
active-job cap counts every partition's active sets before the create script checks its own again (exact with one
partition; with several, creates racing in different partitions at the same moment may each pass it). The dedup of
inbound deliveries (Slack, DingTalk, reconciliation rounds) and the other single-key records (locks, rate
buckets, audit streams, card refs) are one key per command, so they need no tag: a cluster spreads them freely.
The chat outbox's *sent* and *sending* marks of a note share the note's own tag (they are read together). The local
cloud's records share the tag ``{local}`` (an instance's record and the index of instances are written together).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from handlers.jobs import JobState

DEFAULT_PREFIX = "finetune:"
CLUSTER_PARTITIONS = 16  # the partitions a store created on a cluster gets (three primaries or more: all used)


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX
    partitions: int = 1

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, not {self.partitions}")

    # -- partitions ---------------------------------------------------------------------------------------

    def partition_of(self, job_id: str) -> int:
        """The partition of a job (and of everything written with it), fixed by its id."""
        return zlib.crc32(job_id.encode()) % self.partitions if self.partitions > 1 else 0

    def tag(self, partition: int) -> str:
        """The prefix of every key in ``partition``: its hash tag puts them all in one cluster slot. A store of one
        partition (one server: no slots) has untagged names."""
        return f"{self.prefix}{{p{partition}}}:" if self.partitions > 1 else self.prefix

    def _tagged(self, tag: str) -> str:
        """``prefix`` + the hash tag ``tag`` (a group of keys written or read together), on a partitioned store."""
        return f"{self.prefix}{{{tag}}}:" if self.partitions > 1 else self.prefix

    def _of_job(self, job_id: str) -> str:
        return self.tag(self.partition_of(job_id))

    @property
    def all_partitions(self) -> range:
        return range(self.partitions)

    @property
    def layout(self) -> str:
        """Hash: the key layout of this store (``partitions``)."""
        return f"{self.prefix}layout"

    # -- the queues (per partition; the properties name partition 0's, the only one of a single server) -------

    def events_in(self, partition: int) -> str:
        return f"{self.tag(partition)}events"

    def chat_in(self, partition: int) -> str:
        return f"{self.tag(partition)}chat"

    def cloud_in(self, partition: int) -> str:
        return f"{self.tag(partition)}cloud"

    def timers_in(self, partition: int) -> str:
        return f"{self.tag(partition)}timers"

    def queues(self, partition: int) -> list[str]:
        """The events, chat and cloud streams and the timer set of ``partition`` (the store's scripts' order)."""
        return [self.events_in(partition), self.chat_in(partition), self.cloud_in(partition), self.timers_in(partition)]

    def streams(self, queue: str) -> list[str]:
        """Every partition's stream of ``queue`` (``events``, ``chat`` or ``cloud``): what its consumers read."""
        return [getattr(self, f"{queue}_in")(partition) for partition in self.all_partitions]

    @property
    def events(self) -> str:
        return self.events_in(0)

    @property
    def chat(self) -> str:
        return self.chat_in(0)

    @property
    def cloud(self) -> str:
        return self.cloud_in(0)

    @property
    def timers(self) -> str:
        return self.timers_in(0)

    @staticmethod
    def parked(stream: str) -> str:
        """Where a stream's poison messages go."""
        return f"{stream}:parked"

    # -- the job store ------------------------------------------------------------------------------------

    def job(self, job_id: str) -> str:
        return f"{self._of_job(job_id)}job:{job_id}"

    def state(self, state: JobState, partition: int = 0) -> str:
        """Set: the ids of the partition's jobs in ``state``."""
        return f"{self.tag(partition)}state:{state.value}"

    def instances_in(self, partition: int) -> str:
        """Hash: instance id -> job id, for every attempt of every job of the partition."""
        return f"{self.tag(partition)}instances"

    @property
    def instances(self) -> str:
        return self.instances_in(0)

    @property
    def restarts(self) -> str:
        """Hash: "recipe|instance type" -> the restart overhead its jobs measured, in seconds (restart_overhead.py)."""
        return f"{self.prefix}restarts"

    @staticmethod
    def restart_measured(job_id: str, attempt: int) -> str:
        """Under :meth:`dedup`: an attempt's restart overhead went into the estimate (once per attempt)."""
        return f"restart:{job_id}:{attempt}"

    def history(self, job_id: str) -> str:
        return f"{self._of_job(job_id)}history:{job_id}"

    def created_in(self, partition: int) -> str:
        """Sorted set: the partition's jobs, scored by when they were created (``list`` for admins reads the tails)."""
        return f"{self.tag(partition)}jobs:created"

    def chart(self, job_id: str) -> str:
        """Sorted set: the job's (step, loss, time, attempt) points for its chart, scored by step, bounded
        (bot/charts/series.py); deleted with the job."""
        return f"{self._of_job(job_id)}chart:{job_id}"

    def chart_stride(self, job_id: str) -> str:
        """The step stride of :meth:`chart` (one point per stride of steps; doubled whenever the points overflow)."""
        return f"{self._of_job(job_id)}chart-stride:{job_id}"

    @property
    def created(self) -> str:
        return self.created_in(0)

    def channel_jobs(self, platform: str, channel: str, partition: int = 0) -> str:
        """Sorted set: the partition's jobs started in one channel, scored by creation (``list`` reads the tails)."""
        return f"{self.tag(partition)}jobs:channel:{platform}:{channel}"

    def active_nodes_in(self, partition: int) -> str:
        """Hash: job id -> "nodes|group" for the partition's active jobs (the concurrency caps count it,
        :mod:`handlers.caps`)."""
        return f"{self.tag(partition)}jobs:active-nodes"

    def ended_in(self, partition: int) -> str:
        """Sorted set: the partition's jobs in a final state, scored by when they reached it (retention reads it)."""
        return f"{self.tag(partition)}jobs:ended"

    @property
    def ended(self) -> str:
        return self.ended_in(0)

    def dedup(self, key: str) -> str:
        """Once-only markers with a TTL (:meth:`bot.store.JobStore.claim_once`), named by the helpers below."""
        return f"{self.prefix}dedup:{key}"

    def job_dedup(self, job_id: str, key: str) -> str:
        """A once-only marker of an input applied to a job (:meth:`bot.store.JobStore.apply`): in its partition
        (:meth:`dedup`'s name on a store of one partition)."""
        return f"{self._of_job(job_id)}dedup:{key}"

    @staticmethod
    def input_seen(message_id: str) -> str:
        """Under :meth:`dedup`: an events-stream message applied to its job; a redelivery changes nothing. A runner
        report's (``report:<job>:<attempt>:<report id>``) outlives the longest a queue keeps it (bot/core.py)."""
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

    def effect_done(self, effect_id: str, job_id: str | None = None) -> str:
        """The record of an effect the cloud executor carried out (its follow-up was committed with it), in the
        partition of its job (partition 0 for an effect of no job)."""
        tag = self._of_job(job_id) if job_id is not None else self.tag(0)
        return f"{tag}effect:{effect_id}"

    # -- chat -----------------------------------------------------------------------------------------------

    def sent(self, note_id: str) -> str:
        return f"{self._tagged(f'n:{note_id}')}chat:sent:{note_id}"

    def sending(self, note_id: str) -> str:
        """Set before a note's first delivery: a later try knows an earlier one may have gone through."""
        return f"{self._tagged(f'n:{note_id}')}chat:sending:{note_id}"

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
        return f"{self._tagged('local')}local:instances"

    def local_instance(self, instance_id: str) -> str:
        """Hash: one local instance's record (state, control endpoint, job and attempt, prices)."""
        return f"{self._tagged('local')}local:instance:{instance_id}"

    @property
    def local_no_spot(self) -> str:
        """Set: the local cloud's zones without spot capacity now (a test takes it away, and gives it back)."""
        return f"{self.prefix}local:no-spot"

    def local_owner(self, instance_id: str) -> str:
        """Held by the one process that is this local instance: a second launch of the same attempt backs off."""
        return f"{self.prefix}local:owner:{instance_id}"


DEFAULT_KEYS = Keys()
