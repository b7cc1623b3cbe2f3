"""The locks the images install from (``requirements/``, made by ``make lock``) agree with ``pyproject.toml``.

An image installs every dependency from a lock with ``pip --require-hashes`` (Dockerfile, deploy/image/install.sh),
so a requirement raised in pyproject.toml (a floor past an advisory) and not re-locked would never reach an
image. Each lock must pin every direct requirement of what it installs to a version the requirement admits, and
every pinned file by its hash.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Each lock and the extras it installs (install.sh picks the lock by the extras; the Dockerfile takes bot.txt).
LOCKS = {"base.txt": (), "bot.txt": ("bot",), "runner.txt": ("trainer", "swift")}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def pins(lock: Path) -> dict[str, tuple[Version, int]]:
    """Package → (pinned version, number of hashes) of a lock in pip's hashed requirements format."""
    found: dict[str, tuple[Version, int]] = {}
    current = None
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            found[current] = (Version(match.group(2)), 0)
        elif current is not None and line.strip().startswith("--hash=sha256:"):
            version, hashes = found[current]
            found[current] = (version, hashes + 1)
        elif not line.startswith((" ", "\t")):
            current = None
    return found


def direct_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """What pyproject.toml asks for with ``extras``, as it applies on the images (Linux, Python 3.11)."""
    environment = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.9"}
    environment.update(sys_platform="linux", platform_system="Linux", os_name="posix")
    texts = list(PROJECT["dependencies"])
    for extra in extras:
        texts += PROJECT["optional-dependencies"][extra]
    wanted = [Requirement(text) for text in texts]
    return [req for req in wanted if req.marker is None or req.marker.evaluate({**environment, "extra": ""})]


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_direct_requirement_is_pinned_within_its_range_and_every_pin_is_hashed(name: str) -> None:
    lock = ROOT / "requirements" / name
    assert lock.is_file(), f"{lock} is missing: run make lock"
    pinned = pins(lock)
    assert pinned, f"{lock} pins nothing"
    unhashed = sorted(package for package, (_, hashes) in pinned.items() if hashes == 0)
    assert not unhashed, f"{name}: pinned without a hash: {unhashed}"
    for requirement in direct_requirements(LOCKS[name]):
        package = canonicalize_name(requirement.name)
        assert package in pinned, f"{name} lacks {requirement}: run make lock"
        version = pinned[package][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name} pins {package}=={version}, outside pyproject.toml's {requirement}: run make lock"
        )
        if "hiredis" in requirement.extras:  # redis[hiredis]: the extra's own package is locked too
            assert "hiredis" in pinned, f"{name} lacks hiredis, which {requirement} asks for"


def test_the_images_install_from_the_locks_by_hash() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes --no-deps -r /tmp/dist/bot.txt" in dockerfile
    install = (ROOT / "deploy" / "image" / "install.sh").read_text()
    assert '--require-hashes --no-deps -r "$lock"' in install
    makefile = (ROOT / "Makefile").read_text()
    assert "cp requirements/base.txt requirements/bot.txt requirements/runner.txt dist/" in makefile


def test_the_floors_stand_past_the_advisories() -> None:
    """No requirement admits the last release before an advisory's fix (a floor may only rise)."""
    last_vulnerable = {"aiohttp": "3.14.2", "transformers": "5.2.99", "cryptography": "49.0.99"}
    everything = [Requirement(text) for text in PROJECT["dependencies"]]
    everything += [Requirement(text) for extra in PROJECT["optional-dependencies"].values() for text in extra]
    by_name = {canonicalize_name(req.name): req for req in everything}
    for package, version in last_vulnerable.items():
        assert not by_name[package].specifier.contains(Version(version), prereleases=True), by_name[package]
    bot = {canonicalize_name(Requirement(text).name) for text in PROJECT["optional-dependencies"]["bot"]}
    assert "cryptography" in bot  # imported at run time by the SNS signature check, not only by tests
