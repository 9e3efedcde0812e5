# Set-up and everyday commands. Every target installs what it needs itself (venv, pip, headers).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
DEPS   := $(VENV)/.deps-installed
PYTEST := $(VENV)/bin/pytest

.PHONY: install test test-slow demo clean

$(DEPS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.11" cmake ninja
	$(PIP) install -q "numpy>=1.24" "onnx>=1.17" "onnxruntime>=1.21" "onnxscript>=0.7.2,<0.8" "pytest>=8" "hypothesis>=6"
	touch $@

# Build the op library (incrementally, in build/) and install the package into the venv.
install: $(DEPS)
	$(PIP) install -q --no-deps --no-build-isolation .

test: install
	$(PYTEST) -q -m "not slow" tests

test-slow: install
	$(PYTEST) -q -m slow tests

demo: install
	$(VENV)/bin/quest-ort-demo

clean:
	rm -rf build $(VENV)
