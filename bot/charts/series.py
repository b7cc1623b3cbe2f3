"""The points a job's chart is drawn from: (step, loss, time, attempt) of the progress reports the bot accepted.

Kept in Redis (a sorted set per job, scored by step; :meth:`bot.keys.Keys.chart`), so a replica that crashes or a
Redis that restarts loses nothing the job record would not lose. Bounded: one point per *stride* of steps (the
first report to land in a stride keeps it), and when the set grows past ``cap`` points the stride doubles and the
points are thinned to one per wider stride, in the same atomic script; so a job of any length keeps at most
``cap`` points, spread evenly over its steps. A redelivered report finds its stride taken: nothing changes. Steps
trained again after a resume keep the points of their first run (the chart marks where the resume went back to).

The interruptions, resumes, markets and cost are not kept here: the job record's attempts say them already
(:mod:`bot.charts.marks`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from bot.keys import Keys

DEFAULT_CAP = 1000  # points per job: ~60 KB of Redis at most, and more than a chart's width shows

# KEYS: 1 the points, 2 the stride. ARGV: 1 cap, then a step and its point (JSON) for each point, in the order
# given. Returns how many of them were kept.
_ADD = """
local stride = tonumber(redis.call('GET', KEYS[2]) or '1')
local cap = tonumber(ARGV[1])
local kept = 0
for p = 2, #ARGV, 2 do
  local step = tonumber(ARGV[p])
  local low = step - step % stride
  if redis.call('ZCOUNT', KEYS[1], low, low + stride - 1) == 0 then
    redis.call('ZADD', KEYS[1], step, ARGV[p + 1])
    kept = kept + 1
    while redis.call('ZCARD', KEYS[1]) > cap do
      stride = stride * 2
      local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
      local last = nil
      for i = 1, #all, 2 do
        local bucket = math.floor(tonumber(all[i + 1]) / stride)
        if bucket == last then redis.call('ZREM', KEYS[1], all[i]) else last = bucket end
      end
    end
  end
end
if kept > 0 then redis.call('SET', KEYS[2], stride) end
return kept
"""


@dataclass(frozen=True, slots=True)
class Point:
    step: int
    loss: float | None
    at: datetime
    attempt: int

    def dump(self) -> str:
        return json.dumps([self.step, self.loss, round(self.at.timestamp(), 3), self.attempt], separators=(",", ":"))

    @classmethod
    def load(cls, raw: str | bytes) -> Point:
        step, loss, at, attempt = json.loads(raw)
        return cls(int(step), None if loss is None else float(loss), datetime.fromtimestamp(at, UTC), int(attempt))


class ChartSeries:
    """Every job's chart points, in Redis; shared by every replica."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, cap: int = DEFAULT_CAP) -> None:
        if cap < 2:
            raise ValueError(f"a chart needs room for 2 points at least, not {cap}")
        self.redis = redis
        self.keys = keys
        self.cap = cap
        self._add = redis.register_script(_ADD)

    async def add(self, job_id: str, point: Point) -> bool:
        """Keep ``point`` unless its stride has one already (then False: nothing changed)."""
        return await self.add_many(job_id, [point]) == 1

    async def add_many(self, job_id: str, points: Sequence[Point]) -> int:
        """Keep each of ``points`` in turn, as :meth:`add` would, in one script call (one round trip for a
        run of a job's reports); how many were kept."""
        if not points:
            return 0
        if any(point.step < 0 for point in points):
            raise ValueError(f"a step is never negative: {min(point.step for point in points)}")
        keys = [self.keys.chart(job_id), self.keys.chart_stride(job_id)]
        args: list[str | int] = [self.cap]
        for point in points:
            args += [point.step, point.dump()]
        return int(await self._add(keys=keys, args=args))

    async def points(self, job_id: str) -> list[Point]:
        """The job's points, by step."""
        found = await self.redis.zrange(self.keys.chart(job_id), 0, -1)
        return [Point.load(str(raw)) for raw in found]

    async def stride(self, job_id: str) -> int:
        raw = await self.redis.get(self.keys.chart_stride(job_id))
        return int(raw) if raw is not None else 1
