# Whetstone: `make demo` runs one fine-tune end to end, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PKGS   := -e contracts -e services/runtime -e services/devstack -e services/modelkit -e services/ingest -e services/scheduler \
          -e services/trainer-agent -e services/eval -e services/registry -e services/metering \
          -e services/cli -e services/gateway -e services/serving -e services/graders

.PHONY: venv demo test test-unit contracts contracts-check typecheck stack dev clean

venv: $(VENV)/.installed

$(VENV)/.installed: constraints.txt requirements-dev.txt $(wildcard contracts/pyproject.toml services/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch lies on this machine's disk; never let a dependency pull a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	# DeepSpeed builds against the torch above (its config rules are validated with DeepSpeed itself)
	$(BIN)/pip install -q -c constraints.txt wheel setuptools
	$(BIN)/pip install -q --no-build-isolation -c constraints.txt deepspeed
	$(BIN)/pip install -q -c constraints.txt -r requirements-dev.txt $(PKGS)
	touch $@

demo: venv
	$(BIN)/whet demo

# the README's "Interactive use" commands end to end against `whet stack up` + `whet dev` (exit non-zero on a failure)
.PHONY: walkthrough
walkthrough: venv
	bash deploy/tools/walkthrough.sh

test: venv
	sh deploy/tools/ensure-prometheus.sh  # prometheus + promtool for tests/ops (Debian package)
	sh deploy/tools/ensure-bubblewrap.sh  # bwrap, the sandbox of python graders (Debian package)
	sh deploy/tools/ensure-chromium.sh    # headless chromium for tests/console (Debian package)
	sh deploy/tools/ensure-mlflow.sh      # an MLflow tracking server in .venv-mlflow (the tracking test's)
	# two workers; a module's tests (and its module-scoped fixtures) stay on one worker; one torch thread per
	# process, since two workers' intra-op threads oversubscribing the cores make each step wait on a descheduled peer
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope --durations=30

test-unit: venv
	$(BIN)/python -m pytest -m unit

contracts: venv
	$(BIN)/python -m whetstone.contracts.schemas write

contracts-check: venv
	$(BIN)/python -m whetstone.contracts.schemas check

# folders that pass `mypy --strict` (mypy.ini); each service adds its domain/ and usecases/ here
TYPED := contracts/src/whetstone/contracts services/runtime/src/whetstone/runtime services/metering/src/whetstone/metering/domain services/metering/src/whetstone/metering/usecases services/registry/src/whetstone/registry/domain services/registry/src/whetstone/registry/usecases services/trainer-agent/src/whetstone/trainer_agent/domain services/trainer-agent/src/whetstone/trainer_agent/usecases services/scheduler/src/whetstone/scheduler/domain services/scheduler/src/whetstone/scheduler/usecases services/serving/src/whetstone/serving/domain services/serving/src/whetstone/serving/usecases services/ingest/src/whetstone/ingest/domain services/ingest/src/whetstone/ingest/usecases services/eval/src/whetstone/eval/domain services/eval/src/whetstone/eval/usecases services/graders/src/whetstone/graders

typecheck: venv
	$(BIN)/mypy --config-file mypy.ini $(TYPED)

stack: venv
	$(BIN)/whet stack up

dev: venv
	$(BIN)/whet dev

clean:
	rm -rf $(VENV) .whetstone

.PHONY: bench-ingest bench-training bench-metering bench-scheduler
bench-ingest: venv
	$(BIN)/python bench/ingest.py $(ARGS)

bench-training: venv
	$(BIN)/python bench/training.py $(ARGS)

bench-metering: venv
	$(BIN)/python bench/metering.py $(ARGS)

bench-scheduler: venv
	$(BIN)/python bench/scheduler.py $(ARGS)

.PHONY: bench-observability
bench-observability: venv
	$(BIN)/python bench/observability.py $(ARGS)

.PHONY: bench-api
bench-api: venv
	$(BIN)/python bench/api.py $(ARGS)

# tenant B abuses every shared edge while tenant A works; last line JSON
.PHONY: bench-abuse
bench-abuse: venv
	$(BIN)/python bench/abuse.py $(ARGS)

.PHONY: bench-serving
bench-serving: venv
	$(BIN)/python bench/serving.py $(ARGS)

.PHONY: bench-eval
bench-eval: venv
	$(BIN)/python bench/eval.py $(ARGS)

.PHONY: bench-vision
bench-vision: venv
	$(BIN)/python bench/vision.py $(ARGS)

# one gang job across two trainer-agent processes (DDP over gloo) and its one-node twin; last line JSON
.PHONY: bench-multinode
bench-multinode: venv
	$(BIN)/python bench/multinode.py $(ARGS)

# the web console in headless Debian chromium over the embedded stack with 1,000 jobs; last line JSON
.PHONY: bench-console
bench-console: venv
	sh deploy/tools/ensure-chromium.sh
	$(BIN)/python bench/console.py $(ARGS)

# LoRA / QLoRA / full fine-tuning of a random ~1.1B Llama on the GPU it finds (tiny on CPU); last line JSON.
# Needs only torch, transformers, peft (+ bitsandbytes for QLoRA): on a GPU machine `python3 bench/gpu.py`.
.PHONY: bench-gpu
bench-gpu: venv
	$(BIN)/python bench/gpu.py $(ARGS)

# service CPU per message: the per-message exactly-once path, the batched path, a bare decoding consumer
.PHONY: bench-bus
bench-bus: venv
	$(BIN)/python bench/bus.py $(ARGS)

# the platform chaos suite (minutes): six services as processes, ≥ 30 jobs, seeded faults; last line JSON
# (tests/chaos/test_metering_chaos.py runs with `make test`, so it is not run twice)
.PHONY: chaos
chaos: venv
	rm -f .whetstone/chaos-report.json; WHETSTONE_CHAOS=1 $(BIN)/python -m pytest tests/chaos/test_platform_chaos.py -m chaos -q -s; status=$$?; \
	cat .whetstone/chaos-report.json 2>/dev/null || echo '{"error": "no chaos report"}'; exit $$status

# grader run latency per type (string_check, text_similarity, multi, sandboxed python); last line JSON
.PHONY: bench-graders
bench-graders: venv
	$(BIN)/python bench/graders.py $(ARGS)

# reinforcement fine-tuning on this CPU: base vs GRPO candidate vs inverted-reward candidate under the grader; last line JSON
.PHONY: bench-rft
bench-rft: venv
	$(BIN)/python bench/rft.py $(ARGS)
