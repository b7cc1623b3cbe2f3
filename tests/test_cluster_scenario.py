"""The demo's story on a real Valkey cluster (three primaries, three replicas): jobs started through chat,
interrupted, resumed from their checkpoints and finished, with the store's keys spread over every primary.

The bot is given the cluster's URL and nothing else: it finds the cluster (``INFO cluster``), creates its store
with sixteen partitions, and runs every script within one slot. The local cloud's instances run the real runner
with the synthetic trainer (``tests/trainers/synthetic.py``: the trainer contract without torch, the cheapest end
to end that goes through chat and an interruption; what is trained does not matter to the store).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from redis.crc import key_slot

from bot.keys import CLUSTER_PARTITIONS
from bot.redis_server import MappedRedisCluster
from fakes.bot_harness import CHANNEL, eventually, running_bot, settled, wait_job, write_config
from fakes.valkey_cluster import ValkeyCluster
from handlers.jobs import JobState
from tests.cluster_fixtures import fixture_valkey_cluster, fixture_valkey_cluster_server  # noqa: F401 - fixtures
from tests.trainers import synthetic

RECIPES = [synthetic.recipe()]
STEPS = 16
AT_STEP = 4  # interrupt-tested once it trained this far (its SIGTERM handler saves a checkpoint)
USER = "console:ana"
FINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.RESUME_FAILED}


async def test_jobs_are_started_interrupted_resumed_and_finished_through_chat_on_a_cluster(
    tmp_path: Path, valkey_cluster: ValkeyCluster
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=RECIPES)
    async with running_bot(tmp_path / "state", config, redis_url=valkey_cluster.url) as (service, chat):
        store = service.bot.store
        assert isinstance(store.redis, MappedRedisCluster) and store.keys.partitions == CLUSTER_PARTITIONS
        replies = await asyncio.gather(
            *(service.bot.command(USER, CHANNEL, f"start synthetic steps={STEPS}") for _ in range(3))
        )
        job_ids = [reply.split()[1].rstrip(":") for reply in replies]
        assert all(reply.startswith("Starting ft-") for reply in replies), replies

        for job_id in job_ids:
            await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= AT_STEP)
            said = await service.bot.command(USER, CHANNEL, f"interrupt-test {job_id}")
            assert said.startswith("OK"), said
        for job_id in job_ids:
            final = await wait_job(service, job_id, lambda job: job.state in FINAL, timeout=240)
            assert final.state is JobState.SUCCEEDED and final.step == STEPS, final.failure
            assert final.interruptions == 1 and len(final.attempts) == 2
            assert final.attempts[1].resumed_from_step is not None and final.steps_lost == 0
        await eventually(lambda: settled(service), timeout=60)
        for job_id in job_ids:  # each job told about once, in its thread
            thread = [text for job, channel, text in chat.transcript if job == job_id and channel == "thread"]
            finished = [text for text in thread if "finished" in text]
            assert len(finished) == 1, chat.transcript

        # Every job's keys in one slot; the store's keys on all three primaries.
        for job_id in job_ids:
            part = store.keys.partition_of(job_id)
            names = (store.keys.job(job_id), store.keys.history(job_id), store.keys.events_in(part))
            assert len({key_slot(name.encode()) for name in names}) == 1
        holders = [node for node in valkey_cluster.primaries() if node.client().dbsize() > 0]
        assert len(holders) == 3


async def test_a_primary_killed_mid_run_loses_no_job_and_no_note_with_durability_replica(
    tmp_path: Path, valkey_cluster: ValkeyCluster
) -> None:
    """Jobs train while the primary serving the first one's partition is SIGKILLed and its replica promoted
    (CLUSTER FAILOVER TAKEOVER), the dead node coming back as a replica: every job still finishes, and every note
    is posted exactly once. (Until a replica is back, durable writes to those partitions wait: none is acted on.)"""
    durable = {"durability": "replica", "durability_timeout_ms": 2000}
    config = write_config(tmp_path / "bot.yaml", redis=durable, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config, redis_url=valkey_cluster.url) as (service, chat):
        replies = [await service.bot.command(USER, CHANNEL, f"start synthetic steps={STEPS}") for _ in range(3)]
        job_ids = [reply.split()[1].rstrip(":") for reply in replies]
        store = service.bot.store
        first = job_ids[0]
        await wait_job(service, first, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 2)
        primary = valkey_cluster.node_of_slot(key_slot(store.keys.job(first).encode()))
        valkey_cluster.kill(primary)
        valkey_cluster.promote(valkey_cluster.replica_of(primary))
        valkey_cluster.restart(primary)  # its host back: the replica of its partitions' new primary
        for job_id in job_ids:
            final = await wait_job(service, job_id, lambda job: job.state in FINAL, timeout=240)
            assert final.state is JobState.SUCCEEDED and final.step == STEPS, final.failure
        await eventually(lambda: settled(service), timeout=60)
        for job_id in job_ids:
            thread = [text for job, channel, text in chat.transcript if job == job_id and channel == "thread"]
            assert len(thread) == len(set(thread)), thread  # nothing posted twice
            assert sum("finished" in text for text in thread) == 1, thread  # nor lost
