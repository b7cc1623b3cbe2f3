"""``/finetune logs`` is the tail of the trainer's log, ``history`` the job's record: through the real bot.

On the local cloud the trainer's output is a file on this machine (the runner writes it in the instance's work
directory): ``logs`` shows its last lines, each cleaned as any text from outside (no escape sequence, no mention
marker). On a cloud the log stays on the instance, and ``logs`` says so and where the history is.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bot.cloud.local.provider import LocalCloud
from fakes.bot_harness import CHANNEL, quick_recipe, running_bot, start_job, wait_job, write_config
from handlers.decide import new_job
from handlers.jobs import JobState
from tests.test_outside_text import HOSTILE, RAW, SHOWN

CHATTY = quick_recipe(
    "chatty",
    "import sys, time\n"
    + "".join(f"print('line %d of the trainer' % {n}, flush=True)\n" for n in range(1, 41))
    + f"print({HOSTILE!r}, file=sys.stderr, flush=True)\n"
    + "time.sleep(600)\n",
)


async def test_logs_is_the_tail_of_the_trainers_log_cleaned_and_history_the_jobs_record(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[CHATTY])
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start chatty")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        reply = ""
        deadline = time.monotonic() + 120
        while SHOWN not in reply and time.monotonic() < deadline:  # until the trainer's last line is in the file
            reply = await service.bot.command("console:ana", CHANNEL, f"logs {job_id}")
            await asyncio.sleep(0.1)
        lines = reply.splitlines()
        assert lines[0] == f"📜 {job_id}: the last 30 line(s) of the trainer's log (attempt 1)", reply
        assert lines[-1] == SHOWN and not RAW.search(reply)
        assert lines[1:-1] == [f"line {n} of the trainer" for n in range(12, 41)]  # the tail: the last 30
        history = await service.bot.command("console:ana", CHANNEL, f"history {job_id}")
        assert " created " in history and "line 40" not in history
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        assert await cloud.trainer_log(job_id, 2, 30) is None  # an attempt that never ran wrote no log


async def test_on_a_cloud_the_log_stays_on_the_instance_and_logs_says_where_the_history_is(tmp_path: Path) -> None:
    section = {"region": "cn-hangzhou", "bucket": "ft-oss", "image_id": "m-1", "vswitches": {"cn-hangzhou-j": "v-j"}}
    config = write_config(tmp_path / "bot.yaml", aliyun=section)
    async with running_bot(tmp_path / "state", config, finetune_cloud="aliyun") as (service, _):
        made = new_job("ft-7k2q", "tiny", {"steps": 30}, "console:ana", CHANNEL, service.clock())
        assert await service.bot.store.create(made.job, made.history, [])  # no launch: this test has no cloud
        reply = await service.bot.command("console:ana", CHANNEL, "logs ft-7k2q")
        assert reply == (
            "ft-7k2q: the trainer's log stays on its instance on aliyun, out of the bot's reach; "
            "/finetune history ft-7k2q shows the job's history"
        )
        assert " created " in await service.bot.command("console:ana", CHANNEL, "history ft-7k2q")
