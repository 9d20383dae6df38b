# make setup: create .venv with the whole stack (first run builds Horovod: several minutes)
# make demo:  set up, then train on 2 Horovod ranks without and with bytesched over an emulated
#             network, a real CPU model and then emulated GPU-like VGG16 compute (scripts/demo.py),
#             and report the throughput and the speedup of each
# make test:  set up, then run the test suite
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=15
