"""A gang: one job of N nodes that train as one torch.distributed world (``nodes=N``), the world's arithmetic.

The design, settled: **one attempt per node instance.** Each node's instance is its own :class:`Attempt` (its own
number, report key, tags and control object: nothing about keys, tags or tokens changes for gangs), with
``node_rank`` (its rank in the world its runner is in) and ``generation`` (that world's number). ``Job.nodes`` is
the gang's size and ``Job.generation`` its current world; :attr:`Job.gang_attempts` gives the live attempt per
rank, while ``job.current`` keeps meaning the newest attempt, as single-node code expects.

The world is static per generation: ``MASTER_ADDR`` is where the rank-0 node is reached and ``MASTER_PORT`` is
chosen per generation (:func:`master_port`: a port of the last world may still linger on a survivor). Rank 0's own
spec names itself on loopback (torchrun's store listens on every interface, so the others reach it at its private
address), which is why the bot never needs an address before the first launch: node 0 launches first (no zone
pinned), and the others are launched into its zone once its launch result brings its private address
(``Instance.private_ip``; the local cloud's nodes share 127.0.0.1). Losing a node moves the survivors, in their
order, to ranks 0..S-1 of the next generation and gives the replacement the rest, so if the node the world met at
was lost another node takes rank 0 (and the address) without anyone else moving.
"""

from __future__ import annotations

import hashlib

from handlers.jobs import Attempt, Job, Market
from handlers.spec import Gang

LOOPBACK = "127.0.0.1"
# 10000-19999: below Linux's ephemeral range (32768-60999), so no outgoing connection holds one, and below the ports
# the test fakes hand out per xdist worker (fakes/ports.py, from 20000), so a local gang never takes a fake's port.
PORT_BASE = 10_000
PORT_SPAN = 10_000


def master_port(job_id: str, generation: int) -> int:
    """The port the world of ``generation`` meets at: fixed by (job, generation), so every node's spec and every
    regroup agree without asking each other, and a new generation never reuses the last one's."""
    digest = hashlib.sha256(f"{job_id}/{generation}".encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def rank_of(attempt: Attempt) -> int | None:
    """The attempt's rank in the job's current generation (its next rank while its regroup is pending)."""
    return attempt.next_rank if attempt.next_rank is not None else attempt.node_rank


def place_in(job: Job, rank: int) -> Gang:
    """A node's place in the job's current world: rank ``rank``, meeting at rank 0's address.

    ValueError when rank 0's address is not known yet (its launch result has not come): the launch fails, saying
    why."""
    if rank == 0:
        addr = LOOPBACK
    else:
        leader = job.gang_attempts.get(0)
        if leader is None or not leader.private_ip:
            raise ValueError(f"node 0 of {job.id} has no address yet: node {rank} cannot be told where to meet")
        addr = leader.private_ip
    return Gang(
        nodes=job.nodes,
        node_rank=rank,
        generation=job.generation,
        master_addr=addr,
        master_port=master_port(job.id, job.generation),
    )


def new_gang(job: Job, first: int, market: Market, from_step: int | None) -> list[Attempt]:
    """The attempts of a whole gang launched afresh (the first launch, or a move): numbers ``first``.., ranks
    0..N-1, all in the job's current generation."""
    return [
        Attempt(
            number=first + rank,
            market=market,
            node_rank=rank,
            generation=job.generation,
            from_step=from_step,
            launched_with=job.nodes,
        )
        for rank in range(job.nodes)
    ]


def regrouped(job: Job, lost: Attempt) -> tuple[dict[int, int], list[int]]:
    """After ``lost`` (one live attempt): each survivor's rank in the next world (by attempt number; survivors keep
    their order and close up from 0) and the ranks left for replacements."""
    survivors = [attempt for rank, attempt in job.gang_attempts.items() if attempt.number != lost.number]
    ranks = {attempt.number: rank for rank, attempt in enumerate(survivors)}
    return ranks, list(range(len(survivors), job.nodes))
