"""checkov runs in ``make test`` over deploy/ and the Dockerfile, and skips nothing without a reason where it skips.

checkov itself runs in the Makefile (its own environment, one pinned version); this holds the Makefile to running
it over what it must, failing on any finding (no soft fail, no check skipped on the command line), and every skip
in a template to the form checkov reads with its reason on the same line.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SKIP_COMMENT = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?$")
SKIP_ANNOTATION = re.compile(r"^checkov\.io/skip\d+$")
CHECK_ID = re.compile(r"^CKV2?_[A-Z0-9]+_\d+$")


def make_target(name: str) -> str:
    recipe = re.search(rf"^{name}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, f"no {name} target"
    return recipe.group(1)


def test_make_test_runs_checkov_over_deploy_and_the_dockerfile_and_fails_on_a_finding() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "$(MAKE) --no-print-directory checkov" in make_target("test")
    assert re.search(r"^CHECKOV_VERSION := \d+\.\d+\.\d+$", makefile, re.MULTILINE)  # one exact version
    assert "pip install --quiet checkov==$(CHECKOV_VERSION)" in makefile
    assert "-m venv $(CHECKOV_VENV)" in makefile  # its own environment, not the project's
    recipe = make_target("checkov")
    assert "--directory deploy" in recipe and "--file Dockerfile" in recipe
    run = re.search(r"^CHECKOV_RUN := ((?:.*\\\n)*.*)", makefile, re.MULTILINE)
    assert run is not None
    for word in ("--soft-fail", "--skip-check", "--skip-framework", "--check "):
        assert word not in run.group(1), word
    for framework in ("cloudformation", "kubernetes", "dockerfile", "secrets"):
        assert framework in run.group(1)


def scanned_files() -> list[Path]:
    return [path for path in sorted((ROOT / "deploy").rglob("*")) if path.is_file()] + [ROOT / "Dockerfile"]


def test_every_skip_names_a_check_and_says_why_on_its_line() -> None:
    skips = 0
    for path in scanned_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "checkov:skip" in line:
                match = SKIP_COMMENT.search(line)
                assert match is not None, f"{path}:{number}: not the form checkov reads"
                assert CHECK_ID.match(match.group(1)), f"{path}:{number}"
                assert len((match.group(2) or "").strip()) >= 20, f"{path}:{number}: a skip says why"
                skips += 1
    for document in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "finetune-bot.yaml").read_text()):
        for key, value in (document["metadata"].get("annotations") or {}).items():
            if "checkov" in key:
                assert SKIP_ANNOTATION.match(key), key
                check, _, reason = value.partition("=")
                assert CHECK_ID.match(check) and len(reason) >= 20 and "=" not in reason, value
                skips += 1
    assert skips > 0  # the walk sees the skips there are
