"""The runner's life around the happy path: crashes, restarts, stop, already-done jobs, releasing capacity."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from bot.cloud.local.metadata import LocalMetadataServer
from handlers.failures import Failure
from tests.runner_harness import (
    TINY_ARGS,
    of_type,
    read_reports,
    runner_env,
    same_tensors,
    start_runner,
    tiny_command,
    wait_for_report,
    wait_until,
    write_spec,
)


def quick_trainer(code: str) -> list[str]:
    """A trainer that needs no torch: for paths where what it trains does not matter."""
    return [sys.executable, "-c", code]


WRITES_OUTPUT = quick_trainer(
    "import os, pathlib; out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR']);"
    "(out / 'adapter_model.safetensors').write_bytes(b'weights')"
)


async def test_a_crash_is_retried_from_the_last_checkpoint(tmp_path: Path, reference_adapter: bytes) -> None:
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    command = [sys.executable, "-m", "tests.trainers.crash_once", *TINY_ARGS, "--step-seconds", "0.05"]
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=command,
        env={"CRASH_MARKER": str(tmp_path / "crashed"), "CRASH_AT_STEP": "7"},
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 240) == 0

    got = read_reports(reports)
    [restart] = [r for r in of_type(got, "warning") if r["kind"] == "trainer-restart"]
    assert "code 137" in restart["message"] and "from step 5" in restart["message"]
    # The trainer's own progress lines (reports coalesce steps): 6 and 7 ran twice, once before the crash.
    steps = [json.loads(line)["step"] for line in (tmp_path / "work" / "progress.jsonl").read_text().splitlines()]
    assert steps.count(6) == 2 and steps.count(7) == 2 and steps.count(5) == 1 and steps[-1] == 20
    assert of_type(got, "completed")[0]["step"] == 20
    assert same_tensors((store / "output" / "adapter_model.safetensors").read_bytes(), reference_adapter)


async def test_a_crash_loop_is_reported_failed_with_the_last_log_lines(tmp_path: Path) -> None:
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        command=quick_trainer("import sys; print('RuntimeError: CUDA out of memory'); sys.exit(3)"),
        max_restarts=1,
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 60) == 1
    got = read_reports(reports)
    assert len([r for r in of_type(got, "warning") if r["kind"] == "trainer-restart"]) == 1
    [failed] = of_type(got, "failed")
    assert failed["exit_code"] == 3
    assert "gave up after 1 restart" in Failure.model_validate(failed["failure"]).english
    assert "RuntimeError: CUDA out of memory" in failed["log_tail"]
    assert (tmp_path / "work" / "trainer.log").read_text().count("CUDA out of memory") == 2


async def test_sigterm_to_the_runner_checkpoints_and_exits_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=tiny_command("--step-seconds", "0.2"),
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 3)
    runner.send_signal(signal.SIGTERM)  # systemctl stop, or the bot's stop command
    assert await asyncio.wait_for(runner.wait(), 120) == 75
    got = read_reports(reports)
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["reason"] == "stop" and interrupted["saved_in_time"]
    assert interrupted["step"] == max(r["step"] for r in of_type(got, "progress"))
    assert (store / f"checkpoint-{interrupted['step']}" / "MANIFEST.json").exists()


async def test_a_job_already_complete_reports_completed_and_starts_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "COMPLETED.json").write_text(json.dumps({"step": 20, "output_uri": f"file://{store}/output/"}))
    reports = tmp_path / "reports.jsonl"
    marker = tmp_path / "trainer-ran"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        attempt=3,
        command=quick_trainer(f"open({str(marker)!r}, 'w')"),
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    assert await asyncio.wait_for(runner.wait(), 60) == 0
    [completed] = read_reports(reports)
    assert completed["type"] == "completed" and completed["already_complete"] is True
    assert completed["step"] == 20 and completed["attempt"] == 3
    assert not marker.exists()


@pytest.fixture
async def imds_for(aws: str) -> AsyncIterator[Any]:
    servers: list[LocalMetadataServer] = []

    async def start(instance_id: str) -> LocalMetadataServer:
        server = await LocalMetadataServer(instance_id=instance_id).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def launch_instance(ec2: Any) -> str:
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    reservation = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")
    return str(reservation["Instances"][0]["InstanceId"])


async def test_completion_terminates_this_instance_when_asked(tmp_path: Path, aws: str, imds_for: Any) -> None:
    ec2 = boto3.client("ec2", endpoint_url=aws)
    instance_id = launch_instance(ec2)
    imds = await imds_for(instance_id)
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        report=[f"file://{reports}"],
        notice="aws",
        command=WRITES_OUTPUT,
        release={"type": "aws-instance"},
    )
    env = runner_env(AWS_ENDPOINT_URL=aws, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint)
    runner = await start_runner(spec, tmp_path / "work", env)
    assert await asyncio.wait_for(runner.wait(), 60) == 0
    assert of_type(read_reports(reports), "completed")
    state = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    assert (tmp_path / "store" / "output" / "adapter_model.safetensors").read_bytes() == b"weights"


async def test_completion_sets_the_scaling_group_to_zero_when_asked(tmp_path: Path, aws: str) -> None:
    ec2 = boto3.client("ec2", endpoint_url=aws)
    autoscaling = boto3.client("autoscaling", endpoint_url=aws)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName="ft-lt", LaunchTemplateData={"ImageId": image, "InstanceType": "g5.xlarge"}
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="ft-test-asg",
        MinSize=1,
        MaxSize=1,
        DesiredCapacity=1,
        LaunchTemplate={"LaunchTemplateName": "ft-lt"},
        AvailabilityZones=["us-east-1a"],
    )
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{tmp_path}/store/",
        command=WRITES_OUTPUT,
        release={"type": "aws-autoscaling", "group": "ft-test-asg"},
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env(AWS_ENDPOINT_URL=aws))
    assert await asyncio.wait_for(runner.wait(), 60) == 0
    [group] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["ft-test-asg"])["AutoScalingGroups"]
    assert (group["MinSize"], group["DesiredCapacity"]) == (0, 0)


IGNORES_SIGTERM = quick_trainer(
    "import os, pathlib, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR']) / 'checkpoint-4'\n"
    "out.mkdir(parents=True); (out / 'weights.bin').write_bytes(b'w' * 1000); (out / '.finetune-complete').touch()\n"
    "time.sleep(600)"
)


async def test_a_trainer_that_never_saves_gets_its_last_complete_checkpoint_committed(
    tmp_path: Path, imds_for: Any
) -> None:
    imds = await imds_for("i-0stubborn")
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        notice="aws",
        command=IGNORES_SIGTERM,
    )
    env = runner_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, FINETUNE_SYNC_SECONDS="600")
    runner = await start_runner(spec, tmp_path / "work", env)
    await wait_for_report(reports, lambda r: r["type"] == "started")
    # The trainer has ignored SIGTERM and written its checkpoint (its marker comes last): a notice that came
    # sooner, on a busy machine, would kill it before either, and the runner would rightly have nothing to commit.
    await wait_until(lambda: (tmp_path / "work" / "output" / "checkpoint-4" / ".finetune-complete").exists())
    imds.interrupt(seconds=12)  # the trainer gets about half of that, then the runner commits what it has
    assert await asyncio.wait_for(runner.wait(), 60) == 75
    [interrupted] = of_type(read_reports(reports), "interrupted")
    assert interrupted["saved_in_time"] is False
    assert "did not save a checkpoint in time" in interrupted["note"]
    assert interrupted["late"]["cause"] == "not-saved"  # the same as a code: the bot words it
    assert interrupted["step"] == 4 and (store / "checkpoint-4" / "MANIFEST.json").exists()


SAVES_ON_SIGTERM = quick_trainer(
    "import json, os, pathlib, signal, time\n"
    "stop = []\n"
    "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
    "step = 0\n"
    "while not stop:\n"
    "    step += 1\n"
    "    pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE']).open('a').write(json.dumps({'step': step}) + '\\n')\n"
    "    time.sleep(0.05)\n"
    "out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR']) / ('checkpoint-%d' % step)\n"
    "out.mkdir(parents=True); (out / 'w.bin').write_bytes(b'w'); (out / '.finetune-complete').touch()\n"
)


@pytest.mark.parametrize(
    ("control", "reason", "source"),
    [
        ({"type": "stop"}, "stop", "control"),
        ({"type": "interrupt-test", "deadline": "DEADLINE"}, "spot-interruption", "interrupt-test"),
    ],
)
async def test_the_bots_control_object_stops_or_interrupt_tests_the_runner(
    tmp_path: Path, control: dict[str, str], reason: str, source: str
) -> None:
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        command=SAVES_ON_SIGTERM,
        attempt=2,
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 3)
    deadline = (datetime.now(UTC) + timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {key: deadline if value == "DEADLINE" else value for key, value in control.items()}
    (store / "control").mkdir(parents=True, exist_ok=True)
    (store / "control" / "attempt-1.json").write_text(json.dumps({"type": "stop"}))  # another attempt's: ignored
    # Its own object, unreadable for now: the warning it earns proves the runner looked since the other one came.
    (store / "control" / "attempt-2.json").write_text("{not json")
    await wait_for_report(reports, lambda r: r["type"] == "warning" and r["kind"] == "control")
    assert runner.returncode is None and not of_type(read_reports(reports), "notice")
    (store / "control" / "attempt-2.json").write_text(json.dumps(body))
    assert await asyncio.wait_for(runner.wait(), 60) == 75
    got = read_reports(reports)
    [notice] = of_type(got, "notice")
    assert notice["source"] == source
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["reason"] == reason and interrupted["saved_in_time"] is True
    assert (store / f"checkpoint-{interrupted['step']}" / "MANIFEST.json").exists()


async def test_a_runner_launched_ahead_waits_for_go_and_restores_what_the_previous_attempt_committed(
    tmp_path: Path,
) -> None:
    """Make-before-break on one store: attempt 2 comes up while attempt 1 trains, says so, and touches nothing until
    the bot's go, which comes once attempt 1's stop has committed; it then starts from that checkpoint."""
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    common: dict[str, Any] = {"checkpoint_uri": f"file://{store}/", "report": [f"file://{reports}"]}
    old = write_spec(tmp_path / "old.json", **common, command=SAVES_ON_SIGTERM, attempt=1)
    new = write_spec(tmp_path / "new.json", **common, command=SAVES_ON_SIGTERM, attempt=2, handover=True)
    training = await start_runner(old, tmp_path / "work-1", runner_env())
    await wait_for_report(reports, lambda r: r["type"] == "progress" and r["step"] >= 3)
    ahead = await start_runner(new, tmp_path / "work-2", runner_env())
    await wait_for_report(reports, lambda r: r["type"] == "standby" and r["attempt"] == 2)
    # Its control object unreadable for now: the warning it earns proves it looked after standing by, and it has
    # neither restored nor started a trainer.
    (store / "control").mkdir(parents=True, exist_ok=True)
    (store / "control" / "attempt-2.json").write_text("{not json")
    await wait_for_report(reports, lambda r: r["type"] == "warning" and r["attempt"] == 2 and r["kind"] == "control")
    said = {r["type"] for r in read_reports(reports) if r["attempt"] == 2}
    assert ahead.returncode is None and said.isdisjoint({"started", "progress"})

    (store / "control" / "attempt-1.json").write_text(json.dumps({"type": "stop"}))
    assert await asyncio.wait_for(training.wait(), 60) == 75
    [interrupted] = of_type(read_reports(reports), "interrupted")
    assert interrupted["attempt"] == 1 and interrupted["step"] is not None
    (store / "control" / "attempt-2.json").write_text(json.dumps({"type": "go"}))
    started = await wait_for_report(reports, lambda r: r["type"] == "started" and r["attempt"] == 2)
    assert started["resumed_from_step"] == interrupted["step"]
    assert started["restored_bytes"] == 1  # its w.bin, fetched from the store (what the job pays for across regions)

    (store / "control" / "attempt-2.json").write_text(json.dumps({"type": "stop"}))
    assert await asyncio.wait_for(ahead.wait(), 60) == 75


async def test_a_runner_launched_ahead_and_stopped_before_its_go_ends_without_starting_anything(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    reports = tmp_path / "reports.jsonl"
    marker = tmp_path / "trainer-ran"
    spec = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri=f"file://{store}/",
        report=[f"file://{reports}"],
        attempt=4,
        handover=True,
        command=quick_trainer(f"open({str(marker)!r}, 'w')"),
    )
    runner = await start_runner(spec, tmp_path / "work", runner_env())
    await wait_for_report(reports, lambda r: r["type"] == "standby")
    (store / "control").mkdir(parents=True, exist_ok=True)
    (store / "control" / "attempt-4.json").write_text(json.dumps({"type": "stop"}))
    assert await asyncio.wait_for(runner.wait(), 60) == 75
    got = read_reports(reports)
    [standby] = of_type(got, "standby")
    assert standby["cause"] == "handover" and standby["attempt"] == 4
    [interrupted] = of_type(got, "interrupted")
    assert interrupted["reason"] == "stop" and interrupted["step"] is None
    assert not of_type(got, "started") and not marker.exists()


async def test_the_spec_is_read_from_s3_as_user_data_points_to_it(tmp_path: Path, aws: str) -> None:
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket="specs-bucket")
    reports = tmp_path / "reports.jsonl"
    local = write_spec(
        tmp_path / "spec.json",
        checkpoint_uri="s3://specs-bucket/jobs/ft-test/",
        report=[f"file://{reports}"],
        command=WRITES_OUTPUT,
    )
    s3.put_object(Bucket="specs-bucket", Key="jobs/ft-test/spec-attempt-1.json", Body=local.read_bytes())
    runner = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        "s3://specs-bucket/jobs/ft-test/spec-attempt-1.json",
        "--work-dir",
        str(tmp_path / "work"),
        env=runner_env(AWS_ENDPOINT_URL=aws),
    )
    assert await asyncio.wait_for(runner.wait(), 60) == 0
    assert of_type(read_reports(reports), "completed")[0]["output_uri"] == "s3://specs-bucket/jobs/ft-test/output/"
    body = s3.get_object(Bucket="specs-bucket", Key="jobs/ft-test/output/adapter_model.safetensors")["Body"].read()
    assert body == b"weights"
    missing = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        "s3://specs-bucket/jobs/ft-test/nope.json",
        env=runner_env(AWS_ENDPOINT_URL=aws),
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await missing.communicate()
    assert missing.returncode == 2 and b"does not exist" in stderr
