# Two commands on a fresh machine with only Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[bot,trainer,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/finetune-bot demo

test: $(STAMP)
	$(BIN)/ruff check handlers bot runner tests bench
	$(BIN)/mypy
	$(BIN)/cfn-lint deploy/aws/*.yaml
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/notice_to_commit.py
	$(BIN)/python bench/upload_throughput.py
	$(BIN)/python bench/notice_latency.py
	$(BIN)/python bench/bus_throughput.py
	$(BIN)/python bench/slack_latency.py
	$(BIN)/python bench/chaos.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
