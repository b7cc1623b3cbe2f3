"""A gang in the spec, the control object and the reports: what the bot and the runner agree on for multi-node jobs.
Bad input is refused naming the field; a one-node spec is what it was."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from handlers.decide import decide
from handlers.jobs import Job
from handlers.messages import ReportReceived
from handlers.reports import Standby, parse_report
from handlers.spec import (
    Gang,
    RegroupControl,
    StopControl,
    dump_control,
    node_control_key,
    parse_control,
    parse_spec,
)
from runner.agent import Runner
from runner.options import RunnerOptions
from runner.storage.file import FileStore
from runner.supervise import trainer_env
from tests.test_spec import spec

GANG = {"nodes": 2, "node_rank": 1, "generation": 1, "master_addr": "10.0.3.7", "master_port": 29500}


def gang(**changes: Any) -> dict[str, Any]:
    return {**GANG, **changes}


def test_a_gang_spec_parses_and_a_spec_without_one_is_unchanged() -> None:
    parsed = parse_spec(json.dumps(spec(gang=gang(master_addr="ip-10-0-3-7.ec2.internal"))))
    assert parsed.gang == Gang(**gang(master_addr="ip-10-0-3-7.ec2.internal"))
    assert parse_spec(json.dumps(spec())).gang is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"nodes": 1}, "greater than or equal to 2"),
        ({"nodes": 65}, "less than or equal to 64"),
        ({"node_rank": 2}, "node_rank 2 is not below nodes 2"),
        ({"node_rank": -1}, "greater than or equal to 0"),
        ({"generation": 0}, "greater than or equal to 1"),
        ({"master_addr": "tcp://10.0.3.7"}, "neither an IP address nor a host name"),
        ({"master_addr": "10.0.3.7:29500"}, "neither an IP address nor a host name"),
        ({"master_addr": "10.0.3"}, "neither an IP address nor a host name"),
        ({"master_port": 80}, "greater than or equal to 1024"),
        ({"master_port": 70000}, "less than or equal to 65535"),
        ({"rendezvous": "c10d"}, "Extra inputs"),
    ],
)
def test_a_bad_gang_is_refused_naming_the_field(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_spec(json.dumps(spec(gang=gang(**changes))))
    assert str(caught.value).startswith("invalid job spec: ")
    assert "gang" in str(caught.value) and words in str(caught.value)


def test_the_world_is_the_runners_to_set() -> None:
    with pytest.raises(ValueError, match=r"^invalid job spec: .*env sets MASTER_PORT, NODE_RANK, which the runner"):
        parse_spec(json.dumps(spec(gang=gang(), env={"NODE_RANK": "0", "MASTER_PORT": "1"})))
    assert parse_spec(json.dumps(spec(env={"NODE_RANK": "0"}))).env == {"NODE_RANK": "0"}  # one node: the recipe's
    with pytest.raises(ValueError, match=r"^invalid job spec: .*set by the runner"):
        parse_spec(json.dumps(spec(env={"FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": "9"})))


def test_a_regroup_names_the_next_generation_and_a_node_has_its_own_object() -> None:
    regroup = RegroupControl(gang=Gang(**gang(generation=2, node_rank=0)))
    assert parse_control(dump_control(regroup)) == regroup
    assert parse_control(dump_control(StopControl())) == StopControl()
    with pytest.raises(ValidationError):
        parse_control(json.dumps({"type": "regroup", "gang": gang(node_rank=5)}))
    assert node_control_key(3, 2, 1) == "control/attempt-3/generation-2/node-1.json"


def test_the_trainer_gets_the_world_and_the_collective_timeout(tmp_path: Path) -> None:
    member = parse_spec(json.dumps(spec(gang=gang(), report=[], checkpoint_uri=f"file://{tmp_path}/store")))
    runner = Runner(member, RunnerOptions(work_dir=tmp_path / "work", collective_timeout_seconds=45), FileStore(
        member.checkpoint_uri
    ))
    assert trainer_env(runner.spec, runner.options) == {
        "HF_HUB_OFFLINE": "1",
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.3.7",
        "MASTER_PORT": "29500",
        "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": "45",
    }
    assert runner.reports.ids == {"job_id": "ft-7k2q", "attempt": 2, "node_rank": 1, "generation": 1}
    alone = parse_spec(json.dumps(spec(report=[], checkpoint_uri=f"file://{tmp_path}/store")))
    assert trainer_env(alone, RunnerOptions(work_dir=tmp_path / "one")) == {"HF_HUB_OFFLINE": "1"}


def test_the_bot_accepts_a_standby_report_and_records_it() -> None:
    wire = Standby(job_id="ft-7k2q", attempt=1, node_rank=0, generation=1, step=8, cause="stopped").model_dump_json()
    standby = parse_report(wire)
    assert isinstance(standby, Standby) and standby.node_rank == 0
    with pytest.raises(ValidationError):
        parse_report(json.dumps({**json.loads(wire), "cause": "bored"}))
    job = Job(id="ft-7k2q", recipe="tiny", params={}, requested_by="console:test")
    change = decide(job, ReportReceived(report=standby.model_copy(update={"attempt": job.attempt})), datetime.now(UTC))
    assert change is not None
    assert change.history == {"event": "standby", "node_rank": 0, "generation": 1, "step": 8, "cause": "stopped"}
