"""The trainer's user cannot reach the instance metadata service: the exact rules, and the rules at work.

The rules at work need root, iptables and a network namespace (``unshare --net``); each such test runs in a
namespace of its own (tests/metadata_guard_probe.py), with the metadata addresses on its loopback and a listener on
each, so nothing is ever added to this host's firewall. Where any of that is missing they are skipped, saying why.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.metadata_guard import (
    CHAIN,
    IPV4_METADATA,
    IPV6_METADATA,
    MetadataGuard,
    Step,
    guard_steps,
    metadata_guard,
)
from runner.trainer_user import DEFAULT_TRAINER_USER, TrainerUser
from tests.runner_harness import read_reports, runner_env, write_spec

ROOT = Path(__file__).resolve().parent.parent
TRAINER = TrainerUser(name="finetune-train", uid=999, gid=995, groups=(995,))


def test_the_rules_are_these_commands() -> None:
    w = ("iptables", "-w")
    owner = ("-m", "owner", "--uid-owner", "999", "-j", "REJECT")
    assert guard_steps("iptables", 999, IPV4_METADATA) == [
        Step((*w, "-N", CHAIN), unless=(*w, "-n", "-L", CHAIN)),  # made once
        Step((*w, "-F", CHAIN)),  # refilled each time: a restarted runner stacks nothing
        Step((*w, "-A", CHAIN, "-d", "169.254.169.254", *owner)),
        Step((*w, "-A", CHAIN, "-d", "100.100.100.200", *owner)),
        Step((*w, "-I", "OUTPUT", "1", "-j", CHAIN), unless=(*w, "-C", "OUTPUT", "-j", CHAIN)),  # one jump
    ]
    guard = MetadataGuard(uid=999)
    with_v6 = guard.plan(with_ipv6=True)
    assert [step.run[0] for step in with_v6] == ["iptables"] * 5 + ["ip6tables"] * 4
    assert with_v6[7].run[4:6] == ("-d", "fd00:ec2::254") and IPV6_METADATA == ("fd00:ec2::254",)
    assert guard.plan(with_ipv6=False) == with_v6[:5]


def test_the_setting_says_whether_the_guard_is_required(caplog: pytest.LogCaptureFixture) -> None:
    assert metadata_guard(None, TRAINER) == MetadataGuard(uid=999)  # required unless told otherwise
    assert metadata_guard("required", TRAINER) == MetadataGuard(uid=999)
    with caplog.at_level(logging.INFO, logger="runner.metadata_guard"):
        assert metadata_guard("off", TRAINER) is None
        assert metadata_guard("required", None) is None  # the trainer is the runner: nothing to keep from it
    warned = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1 and "can reach the instance metadata service" in warned[0].getMessage()
    assert "holds what the runner holds" in caplog.records[-1].getMessage()
    with pytest.raises(ValueError, match="FINETUNE_METADATA_GUARD='maybe': must be one of required, off"):
        metadata_guard("maybe", TRAINER)


def test_a_runner_given_a_bad_guard_setting_starts_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.json", checkpoint_uri=f"file://{tmp_path}/store/", report=[])
    ran = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--spec", str(spec), "--work-dir", str(tmp_path / "work")],
        env=runner_env(FINETUNE_METADATA_GUARD="maybe"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 2 and "FINETUNE_METADATA_GUARD='maybe'" in ran.stderr
    assert not (tmp_path / "store").exists()


# -- the rules at work, in a network namespace of their own ---------------------------------------------------------


def _namespace_refusal() -> str | None:
    """Why the rules cannot be tried here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("iptables", "ip6tables", "unshare", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    tried = subprocess.run(
        ["unshare", "--net", "--", "iptables", "-w", "-A", "OUTPUT", "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"],
        capture_output=True,
        text=True,
        check=False,
    )
    if tried.returncode != 0:
        return f"no iptables owner match in a network namespace here: {tried.stderr.strip()[-200:]}"
    return None


@pytest.fixture(scope="module")
def namespaces() -> None:
    why = _namespace_refusal()
    if why:
        pytest.skip(f"the guard's rules are tried in a network namespace as root: {why}")


@pytest.fixture(scope="module")
def trainer_account(namespaces: None) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(DEFAULT_TRAINER_USER)
    except KeyError:
        pytest.skip(f"no {DEFAULT_TRAINER_USER} user here (the images make it; tests/test_trainer_sandbox.py may)")


def in_namespace(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    ran = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-m", "tests.metadata_guard_probe", *args],
        env=env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    result: dict[str, object] = json.loads(ran.stdout)
    return result


def test_the_trainers_user_cannot_connect_to_the_metadata_addresses_while_root_can(
    trainer_account: pwd.struct_passwd,
) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    result = in_namespace("rules", str(trainer_account.pw_uid), str(nobody))
    reach = result["reach"]
    assert reach == {
        address: {"root": "open", "trainer": "refused", "other": "open"} for address in IPV4_METADATA + IPV6_METADATA
    }
    # Installed twice (a restarted runner): one rule per address, one jump from OUTPUT.
    owner = f"-m owner --uid-owner {trainer_account.pw_uid} -j REJECT"
    for tool, addresses in (("iptables", [f"{a}/32" for a in IPV4_METADATA]), ("ip6tables", ["fd00:ec2::254/128"])):
        listed = result[tool]
        assert [rule.split(" --reject-with")[0] for rule in listed["chain"]] == [
            f"-A {CHAIN} -d {address} {owner}" for address in addresses
        ]
        assert listed["jumps"] == [f"-A OUTPUT -j {CHAIN}"]


REACH_TRAINER = r"""
for address in 169.254.169.254 100.100.100.200 fd00:ec2::254; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/$address/80" 2>/dev/null; then echo "$address open"
  else echo "$address closed"; fi
done > "$FINETUNE_OUTPUT_DIR/reach"
"""


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory the trainer's user can pass through, as the runner's default work directory is."""
    path = Path(tempfile.mkdtemp(prefix="finetune-guard-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_guarded_runner(reachable: Path, trainer: pwd.struct_passwd, **env: str) -> tuple[dict[str, object], Path]:
    reports = reachable / "reports.jsonl"
    spec = write_spec(
        reachable / "spec.json",
        checkpoint_uri=f"file://{reachable}/store/",
        report=[f"file://{reports}"],
        command=["/bin/bash", "-c", REACH_TRAINER],
    )
    environ = runner_env(
        FINETUNE_TRAINER_USER=trainer.pw_name, FINETUNE_METADATA_GUARD="required", PYTHONPATH=str(ROOT), **env
    )
    result = in_namespace("runner", str(spec), str(reachable / "work"), env=environ)
    return result, reports


def test_the_runner_puts_the_guard_up_before_its_trainer_starts(
    reachable: Path, trainer_account: pwd.struct_passwd
) -> None:
    result, reports = run_guarded_runner(reachable, trainer_account)
    assert result["exit_code"] == 0, result["stderr"]
    reach = (reachable / "store" / "output" / "reach").read_text().split("\n")
    assert reach == ["169.254.169.254 closed", "100.100.100.200 closed", "fd00:ec2::254 closed", ""]
    assert result["root"] == {address: "open" for address in IPV4_METADATA + IPV6_METADATA}  # the runner's own way
    assert read_reports(reports)[-1]["type"] == "completed"


def test_a_runner_that_cannot_put_the_guard_up_starts_no_trainer(
    reachable: Path, trainer_account: pwd.struct_passwd
) -> None:
    result, reports = run_guarded_runner(reachable, trainer_account, PATH="/usr/bin:/bin")  # no iptables on it
    assert result["exit_code"] == 4, result["stderr"]
    [failed] = read_reports(reports)
    assert failed["failure"] == {"code": "metadata-guard-failed", "values": {"error": "iptables is not installed"}}
    assert not (reachable / "work" / "output" / "reach").exists() and not (reachable / "store").exists()
