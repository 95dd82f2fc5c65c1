# brisvox: `make run` (install + daemon in the foreground), `make test` (install + all tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install install-test run test test-fast test-system test-e2e test-sdk-ts lint bench clean

# Order: Debian packages first (python3-venv and the C++ toolchain the venv step needs),
# then the venv pinned by constraints.txt, then the model files. `make run` installs what
# running needs; `make test` adds the test/lint extras, the SIP peers and the TypeScript
# SDK's npm packages (Node 20+ itself is not installed: scripts/install-node.sh says so).
install: .stamp-apt-run .stamp-venv-run .stamp-models
install-test: .stamp-apt-test .stamp-venv-test .stamp-models .stamp-node

.stamp-apt-run: scripts/apt-packages.txt scripts/install-apt.sh
	scripts/install-apt.sh run
	touch $@

.stamp-apt-test: .stamp-apt-run
	scripts/install-apt.sh test
	touch $@

.stamp-venv-run: .stamp-apt-run pyproject.toml constraints.txt scripts/install-venv.sh
	scripts/install-venv.sh $(PYTHON) local
	touch $@

.stamp-venv-test: .stamp-venv-run
	scripts/install-venv.sh $(PYTHON) test,lint,local
	touch $@

.stamp-models: .stamp-venv-run workers/models.py
	$(BIN)/brisvox models install
	touch $@

# The TypeScript SDK: `npm ci` from its lock file, then a first build (needs Node 20+ on PATH).
.stamp-node: scripts/install-node.sh sdk/typescript/package.json sdk/typescript/package-lock.json
	scripts/install-node.sh
	touch $@

run: install
	$(BIN)/brisvoxd start --foreground --config configs/brisvoxd.toml

# Three pytest passes over the given paths: the tests marked `serial` (they assert wall-clock
# timing and need the host to themselves: local models in real time, CPU figures) alone first;
# then those marked `serial_light` (timing with margins that hold beside a few such tests; each
# uses a fraction of a core, most of a timing test's time is spent waiting) TEST_LIGHT_WORKERS
# at a time, a file per worker; then the rest in pytest-xdist workers, a file per worker at a time
# (tests/conftest.py: the local-model files as one unit, sent first). Most system and e2e tests
# wait on subprocesses, so TEST_WORKERS exceeds the 2 cores CI has; the unit and simulation
# tests are CPU-bound, so test-fast uses fewer. Every pass always runs; a pass that selects
# nothing (pytest's exit 5) is no failure.
TEST_WORKERS ?= 4
TEST_FAST_WORKERS ?= 2
TEST_LIGHT_WORKERS ?= 3
# Every Python process of a test run (both pytest passes, their xdist workers, each daemon and
# its children, each `brisvox call`) reads compiled bytecode from one cache outside the source
# tree, even where the environment sets PYTHONDONTWRITEBYTECODE: without it each of them
# compiled the package again and pytest rewrote every test module's asserts again (the
# collection alone took 19 s of CPU per process instead of 6).
PYCACHE := $(CURDIR)/.cache/pycache
PYTEST := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(PYCACHE) $(BIN)/python -m pytest
define run_tests
	$(PYTEST) -m serial $(1); s=$$?; \
	$(PYTEST) -n $(TEST_LIGHT_WORKERS) --dist loadfile -m serial_light $(1); t=$$?; \
	$(PYTEST) -n $(2) --dist loadfile -m "not serial and not serial_light" $(1); p=$$?; \
	[ $$s -eq 0 -o $$s -eq 5 ] && [ $$t -eq 0 -o $$t -eq 5 ] && [ $$p -eq 0 -o $$p -eq 5 ]
endef

test: install-test test-sdk-ts
	$(call run_tests,tests sdk/python/tests,$(TEST_WORKERS))

test-fast: install-test test-sdk-ts
	$(call run_tests,tests/unit tests/sim sdk/python/tests,$(TEST_FAST_WORKERS))

# The TypeScript SDK's own tests (tsc, then node --test; a few seconds).
test-sdk-ts: .stamp-node
	cd sdk/typescript && npm run --silent build && npm test --silent

test-system: install-test
	$(call run_tests,tests/system,$(TEST_WORKERS))

test-e2e: install-test
	$(call run_tests,tests/e2e,$(TEST_WORKERS))

lint: .stamp-venv-test
	$(BIN)/ruff check ipc brisvox workers tests bench sdk/python
	$(BIN)/mypy ipc brisvox workers sdk/python/src
	$(BIN)/lint-imports --no-cache --no-logo

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .cache/pycache .stamp-* .venv-install.log build *.egg-info sdk/typescript/node_modules sdk/typescript/dist .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
