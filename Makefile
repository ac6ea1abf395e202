# jobops: `make run` starts the portal, `make test` runs the whole suite.
# Both install what they need into .venv from the pinned constraints.txt.
# The interpreter the venv is made from. The code runs on Python 3.11+; development and
# CI use 3.12 (.python-version, which pyenv reads), where coverage traces through
# sys.monitoring ([tool.coverage.run] core) at a fraction of the C tracer's cost: that
# is most of make test's budget (docs/development.md#the-test-budget).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MANAGE := $(BIN)/python manage.py

# Development values for `make run`, `make test` and the rest (settings default to
# production: DEBUG off refuses the development secrets). Override on the command line.
export DEBUG ?= true
# A prefix for the checks `make test` runs beside the suite (there: nice).
SIDE ?=
# Bytecode caches (__pycache__/, gitignored) are written even where the shell asks for
# none (PYTHONDONTWRITEBYTECODE): without them every process the tests start compiled
# this project's modules again (0.25 s of a worker's or dispatcher's start), and every
# xdist worker rewrote the assertions of every test module (pytest caches its rewrite
# the same way): 12.6 -> 4.5 CPU s for a worker's collection. The suite writes them
# once before its workers start (tools/warm_bytecode.py), not once in each worker.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install run test suite coverage test-heavy upgrade-check openapi-check lint fmt typecheck docs docs-check migrate topology worker dispatcher bench lock clean

$(STAMP): pyproject.toml constraints.txt clients/python/pyproject.toml .python-version
	@# A venv of another interpreter (say 3.11 before .python-version named 3.12) is made again.
	@[ "$$($(BIN)/python -c 'import sys; print(sys.version_info[:2])' 2>/dev/null)" = \
	   "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" ] || { rm -rf $(VENV); $(PY) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,otel]'
	# The Python client (docs/client.md), editable: tests/client/ imports it.
	$(BIN)/python -m pip install -q -c constraints.txt -e clients/python
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(MANAGE) ensure_database
	$(MANAGE) migrate --noinput

topology: install
	$(MANAGE) setup_topology

# JOBOPS_BROKER=off (docs/smallest-deployment.md): PostgreSQL alone, the processes of
# Procfile.postgres (no Celery workers: honcho would end the run when one exits).
PROCFILE ?= $(if $(filter off false no 0,$(JOBOPS_BROKER)),Procfile.postgres,Procfile)

run: migrate
	-$(MANAGE) setup_topology
	$(MANAGE) collectstatic --noinput -v 0
	$(MANAGE) bootstrap_admin
	$(MANAGE) org bootstrap  # the default organisation, the first admin its admin
	rm -rf var/prometheus  # each process makes its own directory again (core/metrics_dir.py)
	$(BIN)/honcho start -f $(PROCFILE)

lint: install
	$(SIDE) $(BIN)/ruff check .
	$(SIDE) $(BIN)/ruff format --check .
	$(SIDE) $(BIN)/lint-imports

typecheck: install
	$(SIDE) $(BIN)/mypy config core tenants jobs audit dlq
	$(SIDE) $(BIN)/mypy --strict clients/python/src

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The docs/ site (mkdocs.yml): `make docs` builds it into site/ (open site/index.html);
# `make test` builds it strictly, so a broken link or anchor fails the run. Offline.
# (NO_MKDOCS_2_WARNING quiets Material's banner about MkDocs 2.0; mkdocs is pinned to 1.6.)
docs: install
	NO_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

docs-check: install
	NO_MKDOCS_2_WARNING=true $(SIDE) $(BIN)/mkdocs build --strict --quiet --site-dir var/docs-check

# The suite on PYTEST_WORKERS xdist workers, each with its own test database, vhost and
# Redis db (docs/development.md#parallel-test-workers), under coverage: workers and
# dispatchers included ([tool.coverage] in pyproject.toml). Then the table of every
# module not fully covered, and the gate: it prints the orchestration modules' lines no
# test ran and fails naming any under 90 %. Budget: 5 minutes on 2 cores, this whole
# target (docs/development.md#the-test-budget). The tracer slows the schemathesis and
# hypothesis tests about 1.7 times, hence the doubled per-test hang guard.
# `.venv/bin/coverage report --show-missing` prints the last run's report again; the 20
# slowest tests are listed before it, the places to look when the budget is tight.
# 4 by measurement on the shared 2-core machine (the tests mostly wait on processes and
# the network): pytest took 222-279 s with 4 workers, 436 s with 2, 499 s with 6 (each
# worker collects the suite; its test database is a copy of a template migrated once,
# docs/development.md#the-test-database).
# Lint, the type check and the docs build run beside the suite (make -j), not before
# it, and at a low priority (SIDE): about 50 CPU s in a fresh clone (mypy has no cache
# there) that take what the suite leaves while it waits on the processes it starts,
# instead of slowing its workers' start (277 against 307 s, one run each). A failure of
# any fails the target once the suite has ended.
PYTEST_WORKERS ?= 4
test: install
	rm -f .coverage .coverage.*
	$(MAKE) --no-print-directory -j4 SIDE="nice -n 15" lint typecheck docs-check suite

suite: install
	$(BIN)/python tools/warm_bytecode.py
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --timeout=240 \
	  --durations=20 --cov --cov-report=term:skip-covered
	$(BIN)/python tools/coverage_gate.py

# Its former name, from when coverage was not yet part of `make test`.
coverage: test

# The tests `make test` leaves out (`heavy`); .ci/run runs them after it. Among them the
# broker-node-loss test, which starts a three-node RabbitMQ cluster on this machine
# (deploy/rabbitmq-cluster.sh: the Debian rabbitmq-server package, ports 5781-5783).
# Exit 5 is pytest's "no test selected".
test-heavy: install
	$(BIN)/pytest -m heavy --timeout=600 || [ $$? -eq 5 ]

# Issue 38's checks against an older release (START, default the start commit c940624;
# docs/development.md#checks-against-an-older-release). upgrade-check: chains that
# release wrote migrate, verify, take this checkout's appends and verify again, in a
# scratch database beside DATABASE_URL's (1.5-2.5 min, mostly the migrate of an empty
# database; test-heavy runs it too). openapi-check: `manage.py spectacular` of both, byte for byte (cmp).
START ?= c940624
upgrade-check: install
	tools/upgrade_check.sh $(START)

openapi-check: install
	tools/openapi_check.sh $(START)

worker: install
	$(BIN)/honcho start -f Procfile worker_long worker_light

dispatcher: install
	$(MANAGE) run_dispatcher

# Every benchmark at its real size (about 85 min on 2 busy cores), each in its own scratch
# database and vhost (jobops_bench_*); `make bench BENCH_ARGS=--quick` runs them small,
# BENCH_ARGS="--only api,e2e" picks some. Figures: bench/results/*.json (docs/benchmarks.md).
# The peers that bench/executors.py measures (Procrastinate) come from the `bench` extra.
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,otel,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

lock:
	$(PY) -m venv /tmp/jobops-lock && /tmp/jobops-lock/bin/pip install -q -e '.[dev,otel,bench]' \
	  && /tmp/jobops-lock/bin/pip freeze --exclude-editable > constraints.txt

clean:
	rm -rf $(VENV) var .pytest_cache site .coverage .coverage.*
