# One task runner for people and CI (.ci/run calls `make lint test`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TRANSPORT ?= redis
DURATION ?= 3m
HEADLESS ?= 0
SOAK_MINUTES ?= 30
DIST ?= dist
REQS ?= requirements

.PHONY: asyncapi-parser setup lock wheel services jaeger promtool jaeger-ui jaeger-screenshot services-down services-status test test-only lint bench bench-transport bench-serde bench-ingress bench-runtime bench-debounce bench-fairness bench-tenant-flood bench-metastable faults-debounce bench-scaling bench-membership bench-peers bench-redis-calls bench-hostile bench-offload soak demo generate clean

# requirements/*.txt pin every package with its hashes (see `make lock`); the project itself is
# installed editable on top, built by the locked hatchling without fetching anything else.
$(STAMP): pyproject.toml requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

## setup: create .venv and install the project with its dev extras, from requirements/dev.txt
setup: $(STAMP)

## lock: re-resolve requirements/{dev,runtime}.txt after a change to pyproject.toml's
## dependencies (keeps current pins where they still fit; UPGRADE=1 takes the newest of all)
LOCK := $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes -q
lock: setup
	$(LOCK) $(if $(UPGRADE),--upgrade) --extra dev -o $(REQS)/dev.txt
	$(LOCK) -c $(REQS)/dev.txt --extra otel -o $(REQS)/runtime.txt

## wheel: build $(DIST)/pipeline-<version>-py3-none-any.whl (what deploy/image/Dockerfile installs)
wheel: setup
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w $(DIST) .

## services: install (if missing) and start Redis, PostgreSQL, Kafka and S3Proxy on loopback
services:
	bash deploy/local/services.sh up

## jaeger: build Jaeger v2 once (~8 min, cached in ~/.cache/pipeline) and start it on loopback
## (OTLP 4317/4318, query API on 16686); `make services jaeger` starts everything
jaeger:
	bash deploy/local/services.sh up jaeger

## promtool: build Prometheus's promtool once (several minutes, cached in ~/.cache/pipeline);
## tests/deploy/test_promtool.py checks the alerts and the KEDA queries with it, else skips
promtool:
	bash deploy/local/promtool.sh build

## jaeger-ui: build the Jaeger UI once with npm from a jaeger-ui v1.76.0 source tree
## (JAEGER_UI_SRC=path), cached in ~/.cache/pipeline; Jaeger serves it from its next start
jaeger-ui:
	bash deploy/local/jaeger-ui.sh build

## jaeger-screenshot: docs/jaeger-trace.png, a retried webhook's trace in the Jaeger UI
## (headless Chromium; needs the UI built and Jaeger running)
jaeger-screenshot: setup
	bash deploy/local/jaeger-screenshot.sh

## services-down: stop the services that `make services` started (and nothing else)
services-down:
	bash deploy/local/services.sh down

services-status:
	bash deploy/local/services.sh status

## test: start the services, then run the whole suite against them
test: setup services test-only

## asyncapi-parser: the official @asyncapi/parser (npm, node 20) that tests/topics checks with
ASYNCAPI_DIR := tests/topics/asyncapi
$(ASYNCAPI_DIR)/node_modules/.installed: $(ASYNCAPI_DIR)/package-lock.json
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm) \
		|| echo "npm is missing: the AsyncAPI validation test will be skipped"
	if command -v npm >/dev/null; then \
		npm ci --prefix $(ASYNCAPI_DIR) --no-audit --no-fund --silent && touch $@; fi

asyncapi-parser: $(ASYNCAPI_DIR)/node_modules/.installed

## test-only: run the suite against services that are already running (missing ones skip);
## TEST_WORKERS processes share it a test file at a time (0: one process)
TEST_WORKERS ?= 4
test-only: setup asyncapi-parser
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

## lint: ruff, mypy --strict, the import contracts, then the formatting (ruff format --check)
lint: setup
	$(BIN)/ruff check pipeline tests bench consumers scripts demo
	$(BIN)/mypy pipeline scripts demo
	$(BIN)/lint-imports
	$(BIN)/ruff format --check pipeline tests bench consumers scripts demo

## bench: every benchmark; bench-<name>: one of them
bench: bench-transport bench-serde bench-ingress bench-runtime bench-fairness

bench-transport: setup services
	$(BIN)/python bench/transport.py

bench-serde: setup
	$(BIN)/python bench/serde.py

bench-ingress: setup services
	$(BIN)/python bench/ingress.py

bench-runtime: setup services
	$(BIN)/python bench/runtime.py

bench-fairness: setup services
	$(BIN)/python bench/fairness.py

## bench-tenant-flood: a small tenant's wait beside another's flood, through `pipeline consume`, both transports
bench-tenant-flood: setup services
	$(BIN)/python bench/tenant_flood.py --transport kafka
	$(BIN)/python bench/tenant_flood.py --transport redis

## bench-offload: 5 MiB payloads by reference (S3Proxy) vs the largest inline payload (docs/benchmarks.md)
bench-offload: setup services
	$(BIN)/python bench/offload.py

## bench-metastable: a retry storm after a spike, FIFO lane vs deadlines + shedding (docs/faults.md)
bench-metastable: setup
	$(BIN)/python bench/metastable.py

## faults-debounce: kill -9 every 3-5 s under debounced conversation bursts, both transports (docs/faults.md)
faults-debounce: setup
	FAULTS_DEBOUNCE_LOOP=1 $(BIN)/pytest -q -s tests/faults/test_debounce_crashloop.py

## bench-scaling: a simulated week under lag, utilisation and predictive scaling (docs/capacity.md)
bench-scaling: setup
	$(BIN)/python bench/scaling.py

## bench-hostile: each door under attack: slowloris, huge header/body, doubling schema, bad neighbours
bench-hostile: setup services
	$(BIN)/python bench/hostile.py

bench-debounce: setup services
	$(BIN)/python bench/debounce.py

## bench-membership: 3 members, kill -9 every 4 s for 60 s, then a rolling restart, both transports
bench-membership: setup services
	$(BIN)/python bench/membership.py

## bench-redis-calls: CPU per Redis Functions call through redis-py and through the function channel
bench-redis-calls: setup services
	$(BIN)/python bench/redis_calls.py

## bench-peers: pipeline against streaq, arq, saq, taskiq, Celery, FastStream, faust, quixstreams
bench-peers: setup services
	$(BIN)/python bench/peers_bench.py

## soak: SOAK_MINUTES (default 30) of mixed load; RSS, fds and Redis keys must stay flat (not CI)
soak: setup services
	SOAK_MINUTES=$(SOAK_MINUTES) $(BIN)/python bench/soak.py

## demo: the main job on Redis only (TRANSPORT=kafka, DURATION=20s, HEADLESS=1); docs/demo.md
demo: setup
	bash deploy/local/services.sh up redis
	if bash deploy/local/jaeger.sh built; then bash deploy/local/services.sh up jaeger; fi
	if bash deploy/local/s3proxy.sh built; then bash deploy/local/services.sh up s3proxy; fi
	TRANSPORT=$(TRANSPORT) DURATION=$(DURATION) HEADLESS=$(HEADLESS) bash deploy/local/demo.sh

## generate: rewrite docs/configuration.md and deploy/k8s/base/consumers/ from the code
generate: setup
	$(BIN)/python scripts/config_doc.py
	$(BIN)/python scripts/manifests.py

clean:
	rm -rf $(VENV) dist .pytest_cache .mypy_cache .ruff_cache
