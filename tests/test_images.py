"""The images: the wheel ``make dist`` builds is what the bot's Dockerfile and the runner images install, and
deploy/image/install.sh really installs a runner that runs a job, with the systemd unit the boot script starts.

There is no Docker engine here, so the Dockerfile is checked for what it copies, installs and runs (hadolint lints
it in ``make test``); the install script runs for real into a temporary prefix (pip from the package index, the
runner alone: the trainer extra would pull torch again).
"""

from __future__ import annotations

import configparser
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.cloud.user_data import RUNNER_ENV_FILE, RUNNER_UNIT, runner_boot_script
from bot.healthcheck import health_url

ROOT = Path(__file__).resolve().parent.parent
VERSION = (ROOT / "VERSION").read_text().strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built as ``make dist`` builds it, with the locks beside it."""
    recipe = re.search(r"^dist:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None and "pip wheel --quiet --no-deps --wheel-dir dist ." in recipe.group(1)
    locks = ("base.txt", "bot.txt", "runner.txt")
    assert f"cp {' '.join(f'requirements/{lock}' for lock in locks)} dist/" in recipe.group(1)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    for lock in locks:
        shutil.copy(ROOT / "requirements" / lock, out / lock)
    (built,) = out.glob("*.whl")
    return built


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of every instruction, continuation lines joined, comments dropped."""
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, arguments = line.strip().partition(" ")
            found.append((instruction.upper(), arguments.strip()))
    return found


def test_the_wheel_carries_both_programs_their_extras_and_the_license(wheel: Path) -> None:
    assert wheel.name == f"finetune_chatops-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"finetune_chatops-{VERSION}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {"bot/healthcheck.py", "bot/cli.py", "runner/cli.py", "runner/hf/callback.py", "handlers/spec.py"} <= names
    assert not any(name.startswith("tests/") for name in names)
    assert "finetune-bot = bot.cli:main" in entry_points and "finetune-runner = runner.cli:main" in entry_points
    assert {"Provides-Extra: bot", "Provides-Extra: trainer"} <= set(metadata.splitlines())
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert any(name.endswith("licenses/LICENSE") for name in names)


def test_the_dockerfile_installs_that_wheel_and_runs_the_bot_unprivileged(wheel: Path) -> None:
    instructions = dockerfile()
    stages = [arguments for instruction, arguments in instructions if instruction == "FROM"]
    assert len(stages) == 2 and all(re.match(r"python:3\.1[1-9]-slim", stage) for stage in stages)
    copies = [arguments.split() for instruction, arguments in instructions if instruction == "COPY"]
    assert ["dist/", "/tmp/dist/"] in copies  # the only files from the build context: the wheel and its lock
    (install,) = [arguments for instruction, arguments in instructions if "pip install" in arguments]
    pattern = re.search(r"/tmp/dist/(\S+\.whl)", install)
    assert pattern is not None and fnmatch.fnmatch(wheel.name, pattern.group(1))
    # The bot's dependencies from the lock, by hash, then the wheel alone.
    assert "--require-hashes --no-deps -r /tmp/dist/bot.txt" in install and '--no-deps "$1"' in install
    assert "python -m venv /opt/finetune" in install
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert ignore == ["*", "!dist/*.whl", "!dist/bot.txt"]  # the context is the wheel, its lock and nothing else

    settings = dict(instructions)
    user = settings["USER"].split(":")[0]
    assert user.isdigit() and int(user) >= 1000
    env = dict(item.split("=", 1) for item in shlex.split(settings["ENV"]))
    assert env["FINETUNE_HTTP_HOST"] == "0.0.0.0" and env["FINETUNE_STATE_DIR"] == "/var/lib/finetune"
    assert settings["EXPOSE"] == env["FINETUNE_HTTP_PORT"] == "8080"
    assert json.loads(settings["ENTRYPOINT"]) == ["/opt/finetune/bin/finetune-bot"]
    assert json.loads(settings["CMD"]) == ["serve"]
    health = json.loads(settings["HEALTHCHECK"].split("CMD", 1)[1])
    assert health == ["/opt/finetune/bin/python", "-m", "bot.healthcheck"]
    assert health_url({"FINETUNE_HTTP_HOST": "0.0.0.0", "FINETUNE_HTTP_PORT": "8080"}) == (
        "http://127.0.0.1:8080/healthz"
    )


def test_the_healthcheck_follows_the_bots_own_health(tmp_path: Path) -> None:
    from fakes.ports import free_port
    from tests.servers import wait_http

    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(FINETUNE_STATE_DIR=str(tmp_path / "state"), FINETUNE_HTTP_PORT=str(port), FINETUNE_HTTP_HOST="0.0.0.0")
    check = [sys.executable, "-m", "bot.healthcheck"]
    down = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and f"http://127.0.0.1:{port}/healthz" in down.stderr
    bot = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, stdout=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        assert subprocess.run(check, env=env, timeout=60).returncode == 0
    finally:
        bot.terminate()
        bot.wait(30)


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((ROOT / "deploy" / "systemd" / name).read_text())
    return parser


def test_the_units_run_the_installed_programs() -> None:
    runner = unit(RUNNER_UNIT)["Service"]
    assert runner["ExecStart"].split()[:2] == ["/opt/finetune/bin/finetune-runner", "run"]
    assert runner["EnvironmentFile"] == RUNNER_ENV_FILE  # what the boot script writes
    assert "PATH=/opt/finetune/bin:" in runner["Environment"]  # swift / torchrun from the runner's virtualenv
    assert "FINETUNE_TRAINER_USER=finetune-train" in runner["Environment"].split()  # root runner, not trainer
    assert "FINETUNE_METADATA_GUARD=required" in runner["Environment"].split()  # no trainer with the role in reach
    assert set(runner["SuccessExitStatus"].split()) == {"75"} and set(runner["RestartPreventExitStatus"].split()) == {
        "2",
        "4",
        "75",
    }
    script = runner_boot_script({"FINETUNE_SPEC": "s3://b/jobs/ft-1/spec-attempt-1.json"}, "/opt/finetune")
    assert f"systemctl enable --now {RUNNER_UNIT}" in script and "/opt/finetune/bin/finetune-runner" in script

    bot = unit("finetune-bot.service")["Service"]
    assert bot["ExecStart"] == "/opt/finetune/bin/finetune-bot serve"
    assert bot["User"] == "finetune" and bot["EnvironmentFile"] == "/etc/finetune/bot.env"
    assert "FINETUNE_HTTP_HOST=0.0.0.0" in bot["Environment"] and bot["RestartPreventExitStatus"] == "2"
    assert bot["ProtectSystem"] == "strict" and bot["StateDirectory"] == "finetune"
    assert bot["KillMode"] == "mixed"  # the bot stops its embedded Valkey after its loops; systemd does not first


def install(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.update(
        FINETUNE_PREFIX=str(tmp_path / "opt" / "finetune"),
        FINETUNE_SYSTEMD_DIR=str(tmp_path / "systemd"),
        FINETUNE_NO_SYSTEMCTL="1",
        FINETUNE_EXTRAS="",
        PYTHON=sys.executable,
    )
    environ.update(env)
    return subprocess.run(
        ["bash", str(ROOT / "deploy" / "image" / "install.sh"), *args],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_install_refuses_what_it_cannot_install(tmp_path: Path, wheel: Path) -> None:
    for args, says in [
        ((), "usage: install.sh runner|bot WHEEL"),
        (("trainer", str(wheel)), "usage"),
        (("runner", str(tmp_path / "missing.whl")), "no wheel at"),
    ]:
        result = install(tmp_path, *args)
        assert result.returncode == 2 and says in result.stderr, result.stderr
    bad = install(tmp_path, "runner", str(wheel), FINETUNE_PREFIX="/opt/fine tune")
    assert bad.returncode == 2 and "FINETUNE_PREFIX" in bad.stderr
    unlocked = install(tmp_path, "runner", str(wheel), FINETUNE_EXTRAS="trainer")  # no lock holds that set
    assert unlocked.returncode == 2 and "no lock for the extras 'trainer'" in unlocked.stderr
    alone = tmp_path / "alone" / wheel.name  # the wheel copied without the lock make dist puts beside it
    alone.parent.mkdir()
    shutil.copy(wheel, alone)
    lockless = install(tmp_path, "runner", str(alone))
    assert lockless.returncode == 2 and "no lock at" in lockless.stderr
    assert not (tmp_path / "opt").exists()


def test_install_refuses_extra_packages_without_a_pin_and_a_hash(tmp_path: Path, wheel: Path) -> None:
    digest = "--hash=sha256:" + "0" * 64
    for packages, says in [
        ("flash-attn", "'flash-attn' is neither name==version nor --hash"),
        ("flash-attn==2.8.3", "'flash-attn==2.8.3' has no --hash"),
        (f"einops==0.8.1 {digest} flash-attn==2.8.3", "'flash-attn==2.8.3' has no --hash"),
        (f"{digest} einops==0.8.1", "comes before any name==version"),
        ("flash-attn>=2 " + digest, "'flash-attn>=2' is neither"),
        ("einops==0.8.1 --hash=md5:00", "'--hash=md5:00' is neither"),
        ("--index-url=https://example.com/simple", "is neither"),  # no pip option rides along
        ("einops==0.8.1;rm", "is neither"),
    ]:
        result = install(tmp_path, "runner", str(wheel), FINETUNE_PIP_PACKAGES=packages)
        assert result.returncode == 2 and says in result.stderr, (packages, result.stderr)
    assert not (tmp_path / "opt").exists()  # refused before anything was installed


def hashed(tmp_path: Path, requirement: str) -> str:
    """``requirement`` as FINETUNE_PIP_PACKAGES takes it: pinned, with the sha256 of the wheel the index serves."""
    where = tmp_path / "download"
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    subprocess.run(
        [*download, "-d", str(where), requirement],
        check=True,
        capture_output=True,
    )
    (file,) = where.iterdir()
    return f"{requirement} --hash=sha256:{hashlib.sha256(file.read_bytes()).hexdigest()}"


def locked_version(lock: str, package: str) -> str:
    match = re.search(rf"^{package}==(\S+) \\$", (ROOT / "requirements" / lock).read_text(), re.MULTILINE)
    assert match is not None, f"{lock} does not pin {package}"
    return match.group(1)


def test_every_lock_pins_the_installer_by_hash() -> None:
    """install.sh upgrades nothing from the index: pip itself comes from the lock, like every other file."""
    (wanted,) = [line for line in (ROOT / "requirements" / "pip.in").read_text().splitlines() if line[:1].isalpha()]
    for lock in ("base.txt", "bot.txt", "runner.txt"):
        text = (ROOT / "requirements" / lock).read_text()
        assert re.search(rf"^{re.escape(wanted)} \\\n    --hash=sha256:[0-9a-f]{{64}}", text, re.MULTILINE), lock
    script = (ROOT / "deploy" / "image" / "install.sh").read_text()
    assert "--upgrade" not in script and "-U " not in script
    installs = [line for line in script.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and all("--require-hashes" in line or '"$wheel"' in line for line in installs), installs


def test_install_puts_a_runner_that_completes_a_job_and_its_unit_in_place(tmp_path: Path, wheel: Path) -> None:
    extra = hashed(tmp_path, "iniconfig==2.3.0")  # not in the lock: an extra package, pinned and hashed
    result = install(tmp_path, "runner", str(wheel), FINETUNE_PIP_PACKAGES=extra)
    assert result.returncode == 0, result.stdout + result.stderr
    prefix = tmp_path / "opt" / "finetune"
    versions = subprocess.run(
        [f"{prefix}/bin/python", "-c", "from importlib.metadata import version as v; print(v('pip'), v('iniconfig'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert versions.stdout.split() == [locked_version("base.txt", "pip"), "2.3.0"]
    installed = unit(RUNNER_UNIT)
    written = configparser.ConfigParser(strict=False, interpolation=None)
    written.read_string((tmp_path / "systemd" / RUNNER_UNIT).read_text())
    program = written["Service"]["ExecStart"].split()[0]
    assert program == f"{prefix}/bin/finetune-runner" and os.access(program, os.X_OK)
    assert installed["Service"]["ExecStart"].replace("/opt/finetune", str(prefix)) == written["Service"]["ExecStart"]
    assert not list(prefix.glob("*.py"))  # the ms-swift plugin ships inside the runner package, nothing beside it
    where = subprocess.run(
        [f"{prefix}/bin/python", "-c", "import runner; print(runner.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert where.stdout.startswith(str(prefix))  # the wheel's copy, not this checkout
    if os.geteuid() == 0:  # the trainer's user may leave no cron or at job behind to outlive its process tree
        for deny in ("/etc/cron.deny", "/etc/at.deny"):
            assert "finetune-train" in Path(deny).read_text().split(), deny

    # The installed runner runs an attempt to completion: checkpoint committed, output uploaded, reported.
    trainer = (
        "import os, pathlib; out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR']) / 'checkpoint-1'; "
        "out.mkdir(parents=True); (out / 'weights.bin').write_bytes(b'w'); (out / '.finetune-complete').touch()"
    )
    spec = {
        "version": 1,
        "job_id": "ft-img1",
        "attempt": 1,
        "command": [f"{prefix}/bin/python", "-c", trainer],
        "checkpoint_uri": (tmp_path / "bucket" / "jobs" / "ft-img1").as_uri() + "/",
        "report": [(tmp_path / "reports.jsonl").as_uri()],
        "notice": "none",
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ran = subprocess.run(
        [program, "run", "--spec", str(tmp_path / "spec.json"), "--work-dir", str(tmp_path / "work")],
        env={**os.environ, "FINETUNE_TRAINER_ECHO": "0", "FINETUNE_PROGRESS_SECONDS": "0"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    reports = [json.loads(line)["type"] for line in (tmp_path / "reports.jsonl").read_text().splitlines()]
    assert reports[0] == "started" and reports[-1] == "completed"
    assert (tmp_path / "bucket" / "jobs" / "ft-img1" / "COMPLETED.json").exists()


def component_document() -> dict[str, Any]:
    """The Image Builder component's document, its ${…} filled in as CloudFormation would."""
    template = yaml.load((ROOT / "deploy" / "aws" / "runner-image.yaml").read_text(), Loader=_CfnLoader)
    data = template["Resources"]["RunnerComponent"]["Properties"]["Data"]["Fn::Sub"]
    defaults = {name: str(spec.get("Default", "")) for name, spec in template["Parameters"].items()}
    values = {**defaults, "ArtifactBucket": "artifacts", "Version": VERSION}
    document: dict[str, Any] = yaml.safe_load(re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], data))
    return document


class _CfnLoader(yaml.SafeLoader):  # type: ignore[misc]
    """YAML with CloudFormation's short forms (!Ref, !Sub, …) read as their long forms."""


_FUNCTIONS = ("Ref", "Sub", "GetAtt", "Join", "Select", "ImportValue", "Split", "FindInMap")
_CONDITIONS = ("If", "Equals", "Not", "And", "Or", "Condition", "Contains")  # Contains: in Rules

for _tag in _FUNCTIONS + _CONDITIONS:

    def _construct(loader: yaml.SafeLoader, node: yaml.Node, tag: str = _tag) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if tag == "GetAtt":
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        return {tag if tag in ("Ref", "Condition") else f"Fn::{tag}": value}

    _CfnLoader.add_constructor(f"!{_tag}", _construct)


def test_the_image_builder_component_installs_the_release_with_the_script(wheel: Path) -> None:
    document = component_document()
    build = {phase["name"]: phase["steps"] for phase in document["phases"]}
    (download,) = [step for step in build["build"] if step["action"] == "S3Download"]
    assert download["inputs"][0]["source"] == f"s3://artifacts/finetune/{VERSION}/*"
    (command,) = next(step for step in build["build"] if step["name"] == "Install")["inputs"]["commands"]
    words = shlex.split(command)
    assert words[words.index("bash") :] == ["bash", "/tmp/finetune/install.sh", "runner", f"/tmp/finetune/{wheel.name}"]
    assert "FINETUNE_EXTRAS=trainer,swift" in words  # the build instance runs systemd: install.sh reloads it
    checks = " ".join(cmd for step in build["validate"] for cmd in step["inputs"]["commands"])
    assert f"/etc/systemd/system/{RUNNER_UNIT}" in checks and "/opt/finetune/bin/finetune-runner --help" in checks
    # What the AWS production guide tells you to upload is what the script needs, flat in one prefix.
    readme = (ROOT / "docs" / "aws.md").read_text()
    upload = re.search(r"aws s3 cp .*?--recursive|aws s3 sync .*", readme)
    assert upload is not None, "the AWS production guide must give the upload command"
    for name in ("install.sh", RUNNER_UNIT):
        assert name in readme


def test_the_runner_stack_launches_the_image_the_pipeline_writes() -> None:
    image = yaml.load((ROOT / "deploy" / "aws" / "runner-image.yaml").read_text(), Loader=_CfnLoader)
    runner = yaml.load((ROOT / "deploy" / "aws" / "finetune.yaml").read_text(), Loader=_CfnLoader)
    (distribution,) = image["Resources"]["Distribution"]["Properties"]["Distributions"]
    (parameter,) = distribution["SsmParameterConfigurations"]
    assert parameter == {"ParameterName": "/finetune/runner/ami-id", "DataType": "aws:ec2:image"}
    assert runner["Parameters"]["ImageId"]["Default"] == parameter["ParameterName"]
    assert runner["Parameters"]["ImageId"]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
