# The two commands of the README are `make demo` and `make test`; both set up what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
ARGS ?=
# jsii prints an end-of-life banner for Node 20 on every run; it is noise here.
# The end-of-life one must name the Node major version(s) to silence (a comma list).
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 18,20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export CDK_DISABLE_VERSION_CHECK := 1
export CDK_CLI_NOTICES := false
NO_AWS := env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE

.PHONY: help setup checkov-setup torchft-setup system-deps demo-deps tf-deps test test-tf lint synth demo bench chaos clean

help:
	@echo "make demo    deploy the cluster to a local AWS emulator and train across its nodes"
	@echo "make test    run the whole test suite (sets everything up first)"
	@echo "make synth   write the stacks' templates to cdk.out/ (no AWS access needed)"
	@echo "make bench   print the performance figures"
	@echo "make chaos   run the fault drills and print their table"
	@echo "make setup   create .venv and install the Python and npm dependencies"
	@echo "make torchft-setup  install torchft into .venv-torchft (its recovery bench, make bench)"
	@echo "make test-tf install tensorflow-cpu (make tf-deps) and run the TensorFlow tests"

setup: $(VENV)/.setup-stamp node_modules/.setup-stamp

# The project itself goes in editable, without dependencies (they are pinned above), so that
# `.venv/bin/dlc` (and the node commands) exist and run this checkout's code.
$(VENV)/.setup-stamp: requirements.txt requirements-dev.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

node_modules/.setup-stamp: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# checkov (tests/stack/test_checkov.py) from PyPI, in a venv of its own, kept apart from
# the project's dependencies (it pins many libraries of its own).
checkov-setup: .venv-checkov/.setup-stamp

.venv-checkov/.setup-stamp: requirements-checkov.txt
	@test -x .venv-checkov/bin/python || python3 -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install -q --disable-pip-version-check -r requirements-checkov.txt
	@touch $@

# torchft (tests/chaos/test_torchft_bench.py, make bench) in a venv of its own, only when
# asked: never part of make setup, the product does not depend on it (docs/runner.md).
torchft-setup: .venv-torchft/.setup-stamp

.venv-torchft/.setup-stamp: requirements-torchft.txt
	@test -x .venv-torchft/bin/python || python3 -m venv .venv-torchft
	.venv-torchft/bin/python -m pip install -q --disable-pip-version-check -r requirements-torchft.txt
	@touch $@

# Debian packages the MPI and multi-node tests use (sshd, Open MPI, iptables for each node's
# IMDS guard); skipped when present.
system-deps:
	@bash scripts/system-deps.sh

# The demo needs one Debian package: iptables, for the nodes' IMDS guard (only root reaches
# instance metadata); not the MPI tests' sshd and Open MPI.
demo-deps:
	@bash scripts/system-deps.sh iptables

# TensorFlow, opt-in (make demo ARGS="--framework tf" runs this script itself; make test-tf):
# tensorflow-cpu into .venv without changing any installed package (scripts/tf-deps.sh).
TF_REQUIREMENT := tensorflow-cpu==2.21.0
tf-deps: setup
	@bash scripts/tf-deps.sh $(PY) $(TF_REQUIREMENT)

lint: setup
	$(VENV)/bin/ruff check .

# Two pytest-xdist workers (the CI machine's two cores; TEST_WORKERS=0 runs in one process):
# each test file runs whole on one worker, and the files that boot demo clusters run one after
# another on one worker (the scheduler in tests/conftest.py). What the workers
# share on the machine is taken under tests/support/users.py's locks.
TEST_WORKERS ?= 2

test: setup checkov-setup system-deps lint
	$(PY) -m pytest -m "not bench and not tf and not chaos" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		--durations=30 $(PYTEST_ARGS)

# The tests marked `tf` (tests/runner/test_tensorflow.py): not part of make test (and so not
# of CI): installing TensorFlow and running them adds 2-3 minutes to a fresh machine. The emulator's wildcard-bind shim needs gcc (system-deps).
test-tf: setup system-deps tf-deps
	$(PY) -m pytest -m tf $(PYTEST_ARGS)

synth: setup
	$(NO_AWS) npx cdk synth DLClusterStack DLEmrClusterStack --no-lookups -q
	@echo "wrote cdk.out/DLClusterStack.template.json and cdk.out/DLEmrClusterStack.template.json"
	@echo "Deep Learning AMI (public SSM parameter, resolved at deploy time):"
	@grep -ho '"/aws/service/deeplearning/[^"]*"' cdk.out/DLClusterStack.template.json \
		cdk.out/DLEmrClusterStack.template.json | tr -d '"' | sort -u | sed 's/^/  /'

# The demo needs no Debian package (only the MPI tests do), so no apt-get on the way.
demo: setup demo-deps
	$(PY) -m emulator.demo $(ARGS)

bench: setup system-deps
	$(PY) -m pytest -m bench -s -p no:cacheprovider $(PYTEST_ARGS)

# The fault drills (tests/chaos/): faults injected into real processes on the emulator, one
# table row per drill; not part of make test (they take minutes and mount a tmpfs, as root).
chaos: setup system-deps
	$(PY) -m pytest -m chaos -s -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf cdk.out cdk.out.* .pytest_cache build dist *.egg-info demo-report.json
