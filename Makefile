# brisvox: `make run` (install + daemon in the foreground), `make test` (install + all tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS := test,lint,local

.PHONY: install run test test-fast test-system test-e2e lint bench clean

install: .stamp-venv .stamp-apt .stamp-models

.stamp-venv: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

.stamp-apt: scripts/apt-packages.txt
	scripts/install-apt.sh
	touch $@

.stamp-models: .stamp-venv
	$(BIN)/brisvox models install
	touch $@

run: install
	$(BIN)/brisvoxd start --foreground --config configs/brisvoxd.toml

test: install
	$(BIN)/python -m pytest tests

test-fast: install
	$(BIN)/python -m pytest tests/unit tests/sim

test-system: install
	$(BIN)/python -m pytest tests/system

test-e2e: install
	$(BIN)/python -m pytest tests/e2e

lint: .stamp-venv
	$(BIN)/ruff check ipc brisvox workers tests bench
	$(BIN)/mypy ipc brisvox workers

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .stamp-* build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
