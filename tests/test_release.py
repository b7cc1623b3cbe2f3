"""Releases: one version (VERSION) names the wheel, the image tag and every place deploy/ takes a default from;
``make release`` builds them; ``make demo`` installs only what the demo runs while ``make test`` still gets every
extra, in either order, on a fresh clone.

The Makefile runs on a copy of the files its recipes read, never on the checkout: ``make -n`` for the installs
(printing what a fresh clone would run, not 2.5 GB of it), and a real ``make release`` with the suite's own
interpreter standing in for ``.venv``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.cfn_stand_ins import load_template

ROOT = Path(__file__).resolve().parent.parent
VERSION = (ROOT / "VERSION").read_text().strip()
SEMVER = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def copy_for_make(tmp_path: Path, *names: str) -> Path:
    """The Makefile and ``names`` copied to a folder of their own, dated in the past (no stamp is older)."""
    tree = tmp_path / "clone"
    tree.mkdir()
    for name in ("Makefile", "pyproject.toml", "VERSION", *names):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tree / name)
        os.utime(tree / name, (0, 0))
    return tree


def make(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", "-C", str(tree), *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_version_is_semantic_and_the_changelog_has_its_section() -> None:
    assert SEMVER.match(VERSION), VERSION
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE)
    assert "## [Unreleased]" in changelog


def test_every_default_deploy_takes_is_the_version() -> None:
    bot, runner = load_template("bot.yaml"), load_template("runner-image.yaml")
    assert str(bot["Parameters"]["ImageTag"]["Default"]) == VERSION
    assert str(runner["Parameters"]["Version"]["Default"]) == VERSION
    kubernetes = (ROOT / "deploy" / "kubernetes" / "finetune-bot.yaml").read_text()
    assert re.findall(r"image: \S+/finetune-bot:(\S+)", kubernetes) == [VERSION]
    assert f"docker build -t finetune-bot:{VERSION} ." in (ROOT / "Dockerfile").read_text()


def test_the_upgrade_guide_names_only_released_versions() -> None:
    (guide,) = (ROOT / "docs").rglob("upgrading.md")
    named = set(re.findall(r"\b[0-9]+\.[0-9]+\.[0-9]+\b", guide.read_text()))
    released = set(re.findall(r"^## \[([0-9.]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE))
    assert VERSION in named and named <= released, named - released


@pytest.mark.scenario
def test_make_release_builds_the_wheel_the_locks_and_the_image_tag_of_the_version(tmp_path: Path) -> None:
    tree = copy_for_make(tmp_path, "CHANGELOG.md", "README.md", "LICENSE", "requirements", "bot", "runner", "handlers")
    bin_dir = str(Path(sys.executable).parent)  # this suite's interpreter as .venv/bin: nothing installed
    (tree / ".venv").mkdir()
    (tree / ".venv" / ".installed").touch()
    changelog = (tree / "CHANGELOG.md").read_text()
    (tree / "CHANGELOG.md").write_text(changelog.replace(f"## [{VERSION}]", "## [0.0.0]"))
    refused = make(tree, "release", f"BIN={bin_dir}")
    assert refused.returncode != 0 and f"CHANGELOG.md has no '## [{VERSION}]' section" in refused.stderr
    assert not (tree / "dist").exists()  # refused before anything was built

    (tree / "CHANGELOG.md").write_text(changelog)
    result = make(tree, "release", f"BIN={bin_dir}")
    assert result.returncode == 0, result.stderr
    dist = tree / "dist"
    wheel = f"finetune_chatops-{VERSION}-py3-none-any.whl"
    assert {path.name for path in dist.iterdir()} == {wheel, "base.txt", "bot.txt", "runner.txt", "image-tag"}
    assert (dist / "image-tag").read_text() == f"finetune-bot:{VERSION}\n"
    for lock in ("base.txt", "bot.txt", "runner.txt"):
        assert (dist / lock).read_bytes() == (ROOT / "requirements" / lock).read_bytes()
    assert f"docker build -t finetune-bot:{VERSION} ." in result.stdout
    assert f"git tag -a v{VERSION}" in result.stdout


DEMO_EXTRAS = frozenset({"bot", "trainer"})
EVERY_EXTRA = frozenset(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
INSTALL = re.compile(r"pip install (.*)-e '\.\[([a-z,]+)\]'")


def installs(dry_run: str) -> set[tuple[frozenset[str], bool]]:
    """The ``pip install -e '.[extras]'`` a ``make -n`` prints: their extras, and whether each is quiet. (A set: a
    dry run prints a recipe again where a recursive make, the checkov target's, needs it too.)"""
    return {(frozenset(extras.split(",")), "--quiet" in flags) for flags, extras in INSTALL.findall(dry_run)}


@pytest.mark.scenario
def test_make_demo_installs_only_the_demo_s_extras_with_progress_and_make_test_every_extra_after_it(
    tmp_path: Path,
) -> None:
    tree = copy_for_make(tmp_path)
    demo = make(tree, "-n", "demo")
    assert demo.returncode == 0, demo.stderr
    assert re.search(r"-m venv \.venv$", demo.stdout, re.MULTILINE)  # a fresh clone: the virtualenv first
    assert installs(demo.stdout) == {(DEMO_EXTRAS, False)}  # pip shows its progress
    assert "touch .venv/.installed-demo" in demo.stdout and ".venv/bin/finetune-bot demo" in demo.stdout

    # The demo ran: its virtualenv and its stamp are there. make test adds every extra to them, and the demo
    # installs nothing more.
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "bin" / "python").touch()
    (tree / ".venv" / ".installed-demo").touch()
    test = make(tree, "-n", "test")
    assert test.returncode == 0, test.stderr
    assert not re.search(r"-m venv \.venv$", test.stdout, re.MULTILINE)
    assert installs(test.stdout) == {(EVERY_EXTRA, True)}
    again = make(tree, "-n", "demo")
    assert installs(again.stdout) == set() and ".venv/bin/finetune-bot demo" in again.stdout

    # The other order: make test first, then the demo's install finds everything there (pip installs nothing).
    (tree / ".venv" / ".installed-demo").unlink()
    (tree / ".venv" / ".installed").touch()
    assert installs(make(tree, "-n", "test").stdout) == set()
    assert installs(make(tree, "-n", "demo").stdout) == {(DEMO_EXTRAS, False)}


def test_ci_runs_make_test() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in lines
