# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install the provider, initialise a SQLite Airflow home in .airflow-home,
#                 run the example DAG end to end on the local backend and print its result (or why it failed);
#                 the installer's and Airflow's output go to log files, whose paths are printed
#   make test   - create .venv and run the test suite (two workers side by side; PYTEST_ARGS="-m unit" for the
#                 fast lane, TEST_WORKERS=0 for one process)
# Optional:
#   make dags-test DAG=path/to/your_dag.py DAG_ID=your_dag_id [CONF='{"epochs": 2}']
#                - run `airflow dags test` on your own DAG file against .airflow-home (the file's folder is the
#                  dags folder for that run); when it fails, the file's import errors come last
#   make airflow - start a real local Airflow (standalone) with the provider, dags/ and a GPU pool
#                  (AIRFLOW_PORT=8080; AIRFLOW_ARGS="--devices 0,1" to list GPUs by hand)
#   make reliability - run the failure matrix (every backend x every way a task ends, leftovers counted),
#                  print it and write it to docs/reliability.md
#   make gpu-check - on a machine with an NVIDIA GPU: verify every GPU path for real and print a table
#                  (GPU_CHECK_ARGS="--only inventory,local-task"; exits 2 on a machine without a GPU)
#   make cluster-check - on your Kubernetes cluster (KUBECONFIG, CLUSTER_CHECK_NAMESPACE, CLUSTER_CHECK_IMAGE): run the
#                  provider's real objects there and print a table (CLUSTER_CHECK_ARGS="--only rbac,cpu-pod"; exits 2
#                  where no cluster answers)
#   make wheel   - build the provider's sdist and wheel into dist/ (uv build)
#   make smoke-oldest - the tests marked smoke against the oldest supported Airflow: the wheel installed into
#                  .venv-oldest-airflow with the versions pinned in .ci/oldest-airflow.txt (.ci/run runs it)
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# The CPU build of torch lies in /opt/wheels on these machines; elsewhere, pip's own configuration applies.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
TORCH ?= torch==2.13.0
EXTRAS ?= docker,kubernetes,accelerate,nvml,ray,dev

export AIRFLOW_HOME ?= $(CURDIR)/.airflow-home
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__GPU__STATE_DIR ?= $(AIRFLOW_HOME)/gpu-state

.PHONY: venv demo dags-test test fuzz lint bench clean airflow reliability gpu-check cluster-check wheel smoke-oldest oldest-airflow-lock

$(VENV)/.installed: pyproject.toml
	@echo "Installing the provider and its extras into $(VENV) (a few minutes the first time; log: $(VENV)/install.log)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@( $(VENV)/bin/pip install --quiet --disable-pip-version-check uv \
	  && $(UV) pip install --python $(PY) --compile-bytecode $(FIND_LINKS) "$(TORCH)" -e ".[$(EXTRAS)]" \
	) > $(VENV)/install.log 2>&1 || (tail -n 30 $(VENV)/install.log; echo "Install failed: $(VENV)/install.log"; exit 1)
	@touch $@

venv: $(VENV)/.installed

$(AIRFLOW_HOME)/.migrated: $(VENV)/.installed
	@echo "Initialising the Airflow home $(AIRFLOW_HOME) (SQLite; log: $(AIRFLOW_HOME)/migrate.log)"
	@mkdir -p $(AIRFLOW_HOME)
	@$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (cat $(AIRFLOW_HOME)/migrate.log; exit 1)
	@touch $@

demo: $(AIRFLOW_HOME)/.migrated
	@$(PY) scripts/demo.py '$(or $(CONF),{"epochs": 20})'

# `airflow dags test` needs the file in a DAG bundle: its folder is the dags folder (the one bundle) of this run
DAG_FOLDER = $(abspath $(dir $(DAG)))
LOCAL_BUNDLE = [{"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": "$(DAG_FOLDER)"}}]
dags-test: $(AIRFLOW_HOME)/.migrated
	@test -n "$(DAG)" && test -n "$(DAG_ID)" || { echo "usage: make dags-test DAG=path/to/dag_file.py DAG_ID=its_dag_id [CONF='{...}']"; exit 2; }
	AIRFLOW__CORE__DAGS_FOLDER="$(DAG_FOLDER)" AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST='$(LOCAL_BUNDLE)' \
	  $(VENV)/bin/airflow dags test "$(DAG_ID)" -f "$(abspath $(DAG))" $(if $(CONF),-c '$(CONF)') \
	  || { status=$$?; AIRFLOW__CORE__DAGS_FOLDER="$(DAG_FOLDER)" $(PY) scripts/dag_errors.py "$(abspath $(DAG))" "$(DAG_ID)"; exit $$status; }

airflow: venv
	$(PY) scripts/airflow_local.py --port $(or $(AIRFLOW_PORT),8080) $(AIRFLOW_ARGS)

# the lanes side by side: tests sharing a session's engine or cluster stay on one worker (tests/conftest.py)
TEST_WORKERS ?= 2
test: venv
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the fuzz tests' deep search (7,000 + 5,000 + 5,000 cases), not run by make test (which runs a tenth of them)
fuzz: venv
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests/test_fuzz.py tests/policy/test_fuzz_docker.py tests/policy/test_pod_fuzz.py

gpu-check: venv
	$(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

cluster-check: venv
	$(PY) scripts/cluster_check.py $(CLUSTER_CHECK_ARGS)

reliability: venv
	AIRFLOW_GPU_MATRIX=full AIRFLOW_GPU_RELIABILITY_REPORT=$(CURDIR)/docs/reliability.md $(PY) -m pytest tests/reliability -p no:cacheprovider $(PYTEST_ARGS)

wheel: venv
	rm -rf dist
	$(UV) build --quiet --out-dir dist

# The oldest supported Airflow (.ci/oldest-airflow.in): a fresh venv with the wheel and the pinned versions
OLDEST_VENV := $(CURDIR)/.venv-oldest-airflow
# the files that hold tests marked smoke (collecting the others would need the dev extra: hypothesis, accelerate)
SMOKE_FILES := tests/test_provider.py tests/test_example_dags.py tests/test_smoke_demo.py tests/test_airflow_versions.py \
	tests/backends/docker/test_docker_deferred.py tests/backends/kubernetes/test_k8s_render.py
smoke-oldest: venv
	rm -rf $(OLDEST_VENV) build/smoke-wheel
	$(UV) build --quiet --wheel --out-dir build/smoke-wheel
	$(UV) venv --quiet --python $(PYTHON) $(OLDEST_VENV)
	$(UV) pip install --quiet --python $(OLDEST_VENV)/bin/python $(FIND_LINKS) -r .ci/oldest-airflow.txt build/smoke-wheel/*.whl
	$(OLDEST_VENV)/bin/pytest -m smoke -p no:cacheprovider $(PYTEST_ARGS) $(SMOKE_FILES)

# Pin .ci/oldest-airflow.in: third-party packages as they were on that Airflow's release day, Airflow's own
# providers (with the Kubernetes clients the kubernetes extra's floor needs), torch (from /opt/wheels) and
# kubernetes-validate (the schemas of the Kubernetes versions the tests check) as new as install with it.
OLDEST_AIRFLOW_RELEASED := 2025-10-28T00:00:00Z
NEWEST := apache-airflow-providers-common-compat apache-airflow-providers-common-io apache-airflow-providers-common-sql \
	apache-airflow-providers-smtp apache-airflow-providers-standard apache-airflow-providers-docker \
	apache-airflow-providers-cncf-kubernetes kubernetes kubernetes-asyncio kubernetes-validate torch
oldest-airflow-lock: venv
	$(UV) pip compile --quiet --upgrade --python-version 3.11 $(FIND_LINKS) --exclude-newer $(OLDEST_AIRFLOW_RELEASED) \
		$(foreach p,$(NEWEST),--exclude-newer-package $(p)=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)) \
		--custom-compile-command "make oldest-airflow-lock" .ci/oldest-airflow.in -o .ci/oldest-airflow.txt
	sed -i 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/' .ci/oldest-airflow.txt  # the CPU build where /opt/wheels has it

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: venv
	$(PY) -m compileall -q airflow_gpu_provider
	for script in benchmarks/[a-z]*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) $(AIRFLOW_HOME) $(OLDEST_VENV) build/smoke-wheel
