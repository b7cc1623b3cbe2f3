"""An Alibaba scheduled system event through the real bot: the bot passes it on as a save request (the local cloud's
control object), the real runner gets a fresh checkpoint from a trainer that honours save requests and commits it,
the thread says so, and the trainer trains on to the end on the same instance."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fakes.bot_harness import eventually, quick_recipe, running_bot, settled, start_job, wait_job, write_config
from handlers.clock import utcnow
from handlers.jobs import JobState
from handlers.messages import CloudEvent, dump_message

# Steps until its 60th; saves only when the runner asks (runner.save_request), never on its own.
SAVES_ON_REQUEST = """
import json, os, pathlib, time
from runner.save_request import SaveRequest
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
save = SaveRequest()
for step in range(1, 61):
    time.sleep(0.1)
    with progress.open('a') as file:
        file.write(json.dumps({'step': step, 'total_steps': 60}) + '\\n')
    if save.due():
        ckpt = out / ('checkpoint-%d' % step)
        ckpt.mkdir(parents=True)
        (ckpt / 'state.json').write_text(json.dumps({'step': step}))
        (ckpt / '.finetune-complete').touch()
"""


async def test_a_scheduled_system_event_commits_a_fresh_checkpoint_and_the_job_trains_on(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("saver", SAVES_ON_REQUEST)])
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", "start saver")
        job = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 3)
        assert job.current is not None and job.current.instance_id and job.checkpoint is None
        event = CloudEvent(
            kind="scheduled-event",
            instance_id=job.current.instance_id,
            source="acs.ecs",
            deadline=utcnow() + timedelta(days=1),
            detail="SystemMaintenance.Reboot",
        )
        await service.bus.publish(dump_message(event))
        saved = await wait_job(service, job_id, lambda job: job.checkpoint is not None)
        assert saved.checkpoint is not None and saved.checkpoint.step > (job.step or 0)  # fresh: past the signal
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=180)
        assert len(done.attempts) == 1 and done.interruptions == 0  # never stopped, never moved
        await eventually(lambda: settled(service))
        thread = [text for one, channel, text in chat.transcript if one == job_id and channel == "thread"]
        due = f"not before {event.deadline:%Y-%m-%d %H:%M} UTC"  # type: ignore[union-attr]
        assert any("SystemMaintenance.Reboot" in text and due in text for text in thread), thread
        assert any(f"Early checkpoint at step {saved.checkpoint.step}" in text for text in thread), thread
