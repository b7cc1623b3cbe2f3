"""The front page and the guides hold together: the README stays a front page that reaches every guide, the site's
nav holds every page, and the configuration reference is what the settings models say today.

``make test`` also builds the site with ``mkdocs build --strict`` (Makefile ``docs-build``): a broken link or anchor
inside docs/ fails there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot import config_reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")

pytestmark = pytest.mark.unit


def nav_pages() -> list[str]:
    """Every page mkdocs.yml's nav names, in order."""

    def walk(entries: list[object]) -> list[str]:
        pages: list[str] = []
        for entry in entries:
            if isinstance(entry, str):
                pages.append(entry)
            elif isinstance(entry, dict):
                for value in entry.values():
                    pages += walk(value) if isinstance(value, list) else [value]
        return pages

    return walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_the_readme_is_a_front_page_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the rest into a guide in docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^make (\w+)", readme.split("```sh\n", 1)[1].split("```", 1)[0], re.M)
    assert commands[:2] == ["demo", "test"]


def test_the_readme_links_every_guide_in_the_nav_and_nothing_missing() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = {target.split("#", 1)[0] for target in LINK.findall(readme) if not target.startswith(("http", "#"))}
    for target in targets:
        assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
    linked = {target.removeprefix("docs/") for target in targets if target.startswith("docs/")}
    unlinked = [page for page in nav_pages() if page not in linked]
    assert not unlinked, f"README.md links no guide of {unlinked}"


def test_the_nav_holds_every_page_of_docs_once() -> None:
    pages = nav_pages()
    assert len(pages) == len(set(pages)), "a page twice in mkdocs.yml's nav"
    on_disk = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk


def test_the_configuration_reference_is_what_the_settings_models_say() -> None:
    committed = (DOCS / "configuration.md").read_text()
    assert committed == config_reference.render(), (
        "docs/configuration.md differs from the settings models: run python -m bot.config_reference --write"
    )


def test_the_configuration_reference_names_every_setting_and_config_key() -> None:
    from bot.settings import FileConfig, Settings

    page = config_reference.render()
    for name in Settings.model_fields:
        assert f"| `{name.upper()}` |" in page
    for name in FileConfig.model_fields:
        assert f"| `{name}` |" in page and f"### `{name}" in page
    for name in config_reference.OTHER_VARIABLES:
        assert f"| `{name}` |" in page


def test_a_variable_read_in_the_code_but_not_described_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    described = dict(config_reference.OTHER_VARIABLES)
    del described["FINETUNE_SYNC_SECONDS"]
    monkeypatch.setattr(config_reference, "OTHER_VARIABLES", described)
    with pytest.raises(ValueError, match="describe FINETUNE_SYNC_SECONDS"):
        config_reference.render()
    monkeypatch.setattr(config_reference, "OTHER_VARIABLES", {**described, "FINETUNE_NOT_READ": ("runner", "x")})
    with pytest.raises(ValueError, match="read nowhere: FINETUNE_NOT_READ"):
        config_reference.render()


def test_a_field_that_says_nothing_of_itself_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    every = dict(config_reference.FIELD_NOTES)
    notes = {key: note for key, note in every.items() if key != "Settings.finetune_cloud"}
    monkeypatch.setattr(config_reference, "FIELD_NOTES", notes)
    with pytest.raises(ValueError, match=r"Settings\.finetune_cloud says nothing of itself"):
        config_reference.render()
    twice = {**every, "Settings.finetune_config_yaml": "twice"}
    monkeypatch.setattr(config_reference, "FIELD_NOTES", twice)
    with pytest.raises(ValueError, match="finetune_config_yaml has a comment in the code"):
        config_reference.render()


def test_comments_are_read_beside_above_and_carried_on() -> None:
    from bot.cloud.aliyun.settings import AliyunSettings
    from bot.settings import Settings

    comments = config_reference._comments(AliyunSettings)
    assert comments["ram_role"].endswith("(and, without a runner storage role, the bucket's jobs/ itself)")
    assert comments["runner_storage_role_arn"].startswith("The runner stack's RunnerStorageRoleArn")
    assert comments["max_launch_failures"].startswith("capacity failures within one launch")
    assert config_reference._comments(Settings)["finetune_config_yaml"] == (
        "the config file's content, where no file can be mounted"
    )
