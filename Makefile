# make setup: create .venv with the whole stack (first run builds Horovod: several minutes)
# make demo:  set up, then train on 2 Horovod ranks without and with bytesched over an emulated
#             network, a real CPU model and then emulated GPU-like VGG16 compute (scripts/demo.py),
#             and report the throughput and the speedup of each
# make lint:  set up, then lint (ruff) and type-check the package (mypy); every `type: ignore[...]`
#             in the package and every `noqa` says why, after it
# make test:  set up, then run the test suite
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo lint test

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	@! grep -rnE '# type: ignore\[[^]]*\] *$$' --include='*.py' bytesched \
		|| { echo "lint: a type: ignore above has no reason after it"; exit 1; }
	@! grep -rnE '# noqa: [A-Z0-9, ]+ *$$' --include='*.py' bytesched benchmarks tests scripts examples csrc docs \
		|| { echo "lint: a noqa above has no reason after it"; exit 1; }

test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=15
