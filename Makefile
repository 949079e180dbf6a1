# Slipstream: the two commands of the quick start are `make demo` and `make test`.
# Every target sets up what it needs; caches live outside the repo (~/.cache).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: venv demo test test-unit lint bench clean engine-test

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing slipstream (pip cache: ~/.cache/pip)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q --progress-bar on -e '.[dev,tools]'
	@touch $(STAMP)

# The main job: a local control plane, Prometheus and the operator (helm-installed),
# a ServingDeployment in mode Auto on simulated engines, traffic in phases, and the
# threshold following it live; writes out/demo-timeline.png and stops everything.
# Reuses a running `slipstream cluster up`.
demo: venv kube-bins prometheus
	$(VENV)/bin/slipstream demo --plot out/demo-timeline.png

# The twin's benchmark: every scheduler policy on the built-in multi-tenant workload.
bench: venv
	$(VENV)/bin/slipstream bench --workload builtin:multi-tenant --plot out/bench-cdf.png

# Pinned etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# kwok and helm, built from the Go module proxy into ~/.cache/slipstream/bin/
# (reused when present).
.PHONY: kube-bins
kube-bins:
	bash scripts/build-kube.sh

# Pinned Prometheus server (Debian's package prometheus=2.42.0+ds-5+deb12u1, apt-get);
# prints "cached" when it is installed. Tests start their own server on a free port.
.PHONY: prometheus
prometheus:
	bash scripts/install-prometheus.sh

# Everything CI runs: set-up of every tier, then all tests (tests/run-tiers.sh). First the
# cluster tests that wait on controllers and timers, on CLUSTER_WORKERS workers, each with
# its own control plane, a test file per worker. Then the tests marked `alone` (the closed
# loop, the live loopbench, the fault tests that send traffic): they keep a time scale and
# prove it held from the simulators' lag, and use a fraction of the CPU, so the engine tier
# and then the unit and integration tiers (one pytest worker per core; WORKERS=0 runs them
# in pytest's own process) run beside them at the idle scheduling class.
WORKERS ?= auto
CLUSTER_WORKERS ?= 2
test: venv kube-bins prometheus engine-env
	PY=$(PY) WORKERS=$(WORKERS) CLUSTER_WORKERS=$(CLUSTER_WORKERS) bash tests/run-tiers.sh

# The engine tier's environments (sglang 0.5.18 and 0.5.23, patched and pristine), built
# once into ~/.cache/slipstream and reused.
.PHONY: engine-env
engine-env:
	@for v in 0.5.18 0.5.23; do SGLANG_VERSION=$$v bash engine_image/test-env/setup.sh >/dev/null || exit 1; done

# Real sglang scheduler code on CPU (a separate cached env per version, ~/.cache/slipstream):
# the whole engine tier on 0.5.18 and on 0.5.23, each patched and pristine, side by side.
engine-test:
	bash tests/engine/run-all.sh --durations=10

test-unit: venv
	$(PY) -m pytest tests/unit -n $(WORKERS)

lint: venv
	$(VENV)/bin/ruff check operator tests
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) out .pytest_cache
