# Two commands on a fresh machine with only Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What is installed in .venv: every extra (make test and the rest), or only what the demo runs (make demo).
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The one place the version is written (pyproject.toml reads it too): the wheel's, the image's and the tag's.
VERSION := $(shell cat VERSION)
IMAGE := finetune-bot
PROMTOOL := $(VENV)/bin/promtool
# checkov, the infrastructure-as-code scanner, in an environment of its own: its many pinned dependencies would
# fight the project's. One exact version, so a new release's checks arrive by a change here, not by surprise.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(VENV)/checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov

.PHONY: demo test unit lint bench clean dist lock release checkov docs docs-build

# pytest-xdist workers: twice the cores this process may use (most scenario tests wait on servers and subprocesses,
# so two per core keeps the cores busy), at least 2, at most 8 (each worker runs its own Valkey, moto and trainers).
# worksteal: an idle worker takes queued tests from a busy one, so the slow trainer files at the end of the
# alphabet do not leave one worker finishing alone. PYTHONDONTWRITEBYTECODE= : where the environment sets it, every worker and
# every bot, runner and trainer process the suite starts would compile (and pytest rewrite) the project's modules
# again; with the cache, collecting costs a worker 12 s of CPU instead of 25 s.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(max(2, min(8, 2 * len(os.sched_getaffinity(0)))))')

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml VERSION | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bot,trainer,swift,dev]'
	touch $(STAMP)

# The demo's own: the bot and the tiny trainer (torch, transformers), not ms-swift or the tools of make test; with
# pip's progress, since a first run downloads about a gigabyte. make test later adds the rest to the same .venv.
$(DEMO_STAMP): pyproject.toml VERSION | $(BIN)/python
	$(BIN)/python -m pip install -e '.[bot,trainer]'
	touch $(DEMO_STAMP)

# promtool, which checks and unit-tests deploy/prometheus/alerts.yaml: the one binary of Debian's prometheus package,
# taken out of the .deb (apt-get download: nothing installed system-wide, no Prometheus daemon started, no root once
# the package lists exist; .ci/run refreshes them on a fresh machine). PyPI has no package that ships it.
$(PROMTOOL): | $(STAMP)
	rm -rf $(VENV)/prometheus-deb && mkdir -p $(VENV)/prometheus-deb
	cd $(VENV)/prometheus-deb && apt-get download prometheus
	dpkg-deb --fsys-tarfile $(VENV)/prometheus-deb/prometheus_*.deb | tar -x -C $(VENV)/prometheus-deb ./usr/bin/promtool
	mv $(VENV)/prometheus-deb/usr/bin/promtool $@ && rm -rf $(VENV)/prometheus-deb

$(CHECKOV): | $(STAMP)
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)
	$(CHECKOV) --version

# checkov over deploy/ (its CloudFormation and Kubernetes checks; checkov has none for Alibaba's ROS, the systemd
# units, install.sh, Prometheus or Grafana, which its secrets scan reads like every file there) and the bot's
# Dockerfile. Offline: no download of Bridgecrew's policy metadata or guidelines (--skip-download, BC_SKIP_MAPPING).
# Every check passes or is skipped in the template itself, with its reason on the line that skips it; checkov exits
# non-zero on any failed check (no --soft-fail), which fails make test.
CHECKOV_RUN := BC_SKIP_MAPPING=TRUE $(CHECKOV) --quiet --compact --skip-download --enable-secret-scan-all-files \
	--framework cloudformation kubernetes dockerfile secrets
checkov: $(CHECKOV)
	$(CHECKOV_RUN) --directory deploy
	$(CHECKOV_RUN) --file Dockerfile

demo: $(DEMO_STAMP)
	$(BIN)/finetune-bot demo

test: $(STAMP) $(PROMTOOL) $(CHECKOV)
	$(BIN)/ruff check handlers bot runner fakes tests bench
	$(BIN)/mypy
	$(BIN)/cfn-lint deploy/aws/*.yaml
	$(BIN)/hadolint Dockerfile
	$(BIN)/shellcheck deploy/image/*.sh
	$(BIN)/kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml
	$(MAKE) --no-print-directory checkov
	$(PROMTOOL) check rules deploy/prometheus/alerts.yaml
	$(PROMTOOL) test rules deploy/prometheus/alerts.test.yaml
	$(MAKE) --no-print-directory docs-build
	PROMTOOL=$(abspath $(PROMTOOL)) PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The guides as a site (mkdocs.yml, the Material theme): served with live reload on http://127.0.0.1:8000.
# NO_MKDOCS_2_WARNING: Material's banner about its successor, printed on every run, says nothing about these docs.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: $(STAMP)
	$(MKDOCS) serve

# make test builds the site with --strict (a broken link or anchor, a page missing from the nav: the build fails)
# into a directory of its own, removed afterwards: site/ is never written in the work tree. Not --quiet: it hides
# the warnings that --strict counts, and the build would pass with a broken link.
docs-build: $(STAMP)
	site=$$(mktemp -d) && $(MKDOCS) build --strict --site-dir "$$site"; status=$$?; rm -rf "$$site"; exit $$status

# The quick check while editing: the unit tests alone (no server, no subprocess; tests/markers.py).
unit: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -m unit -n $(PYTEST_WORKERS)

# The wheel the bot's image (Dockerfile) and the runner images (deploy/image/install.sh) install, with the locks
# they install its dependencies from (every file pinned by hash).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	cp requirements/base.txt requirements/bot.txt requirements/runner.txt dist/

# A release of VERSION: the wheel and its locks (make dist) in dist/, and the bot's image tag in dist/image-tag; the
# locks are requirements/ as committed (make lock refreshes them, a change tested like any other). Refused while
# CHANGELOG.md has no section for the version. It builds no image and pushes no tag (no Docker engine or remote is
# assumed here): it prints the commands that do.
release: $(STAMP)
	@grep -q '^## \[$(VERSION)\]' CHANGELOG.md || { echo "make release: CHANGELOG.md has no '## [$(VERSION)]' section" >&2; exit 2; }
	$(MAKE) --no-print-directory dist
	test -f dist/finetune_chatops-$(VERSION)-py3-none-any.whl
	echo '$(IMAGE):$(VERSION)' > dist/image-tag
	@echo "release $(VERSION) in dist/: $$(cd dist && echo *); then:"
	@echo "  docker build -t $(IMAGE):$(VERSION) .    # and push it where deploy/ takes it (ImageTag=$(VERSION))"
	@echo "  git tag -a v$(VERSION) -m 'finetune-chatops $(VERSION)' && git push origin v$(VERSION)"

# The locks, after a change to the dependencies in pyproject.toml (tests/test_lock.py says when they disagree):
# base (the runner agent alone), bot (the bot's image), runner (the GPU image: the trainer and ms-swift); each holds
# pip itself too (requirements/pip.in), which install.sh takes from the lock instead of upgrading it from the index.
LOCK := $(BIN)/uv pip compile pyproject.toml requirements/pip.in --universal --python-version 3.11 --generate-hashes --quiet \
	--custom-compile-command "make lock"
lock: $(STAMP)
	$(LOCK) -o requirements/base.txt
	$(LOCK) --extra bot -o requirements/bot.txt
	$(LOCK) --extra trainer --extra swift -o requirements/runner.txt

bench: $(STAMP)
	$(BIN)/python bench/notice_to_commit.py
	$(BIN)/python bench/notice_during_save.py
	$(BIN)/python bench/upload_throughput.py
	$(BIN)/python bench/notice_model.py
	$(BIN)/python bench/notice_latency.py
	$(BIN)/python bench/bus_throughput.py
	$(BIN)/python bench/slack_latency.py
	$(BIN)/python bench/policy_traces.py
	$(BIN)/python bench/policy_regions.py
	$(BIN)/python bench/policy_bound.py --dates
	$(BIN)/python bench/chaos.py
	$(BIN)/python bench/gang_recovery.py
	$(BIN)/python bench/gang_recovery_live.py
	$(BIN)/python bench/cluster_store.py
	$(BIN)/python bench/cluster_path.py
	$(BIN)/python bench/trainer_start.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
