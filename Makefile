# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv on first use and installs the project into it, editable, with its extras.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[mpi,mlx,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tbrun -np 4 examples/hello.py

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
