#!/usr/bin/env bash
# Idempotent set-up: creates .venv in the repository and installs the whole stack
# (torch CPU, MXNet, Horovod built from source with PyTorch+MXNet+Gloo, test tools, bytesched).
# The first run takes several minutes (the Horovod build); later runs take seconds because the
# Horovod wheel is cached outside the repository, keyed by every version it was built against.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BYTESCHED_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
CACHE="${BYTESCHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bytesched}"
HOROVOD_VERSION=0.28.1
LOG_DIR="$CACHE/logs"
mkdir -p "$LOG_DIR"

stage=0
STAGES=6
say() { stage=$((stage + 1)); echo "[setup $stage/$STAGES] $*"; }

# Runs a command with its output in a log; on failure names the step and shows the log's tail.
run_logged() {
  local what="$1" log="$2"; shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "[setup] FAILED: $what" >&2
    echo "[setup] last lines of $log:" >&2
    tail -n 30 "$log" | sed 's/^/    /' >&2
    exit 1
  fi
}

command -v "$PYTHON" >/dev/null || { echo "[setup] FAILED: $PYTHON not found (bytesched needs Python 3.11)" >&2; exit 1; }

say "virtual environment at $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  run_logged "create venv" "$LOG_DIR/venv.log" "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
CONSTRAINTS=(-c "$ROOT/requirements/constraints.txt")

say "Python packages: torch (CPU), mxnet, numpy, scikit-optimize, pyzmq, test tools"
# Skip pip entirely when the stack files are unchanged since the last successful install.
stamp="$VENV/.bytesched-stack"
want="$(cat "$ROOT/requirements/stack.txt" "$ROOT/requirements/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  run_logged "pip install of requirements/stack.txt" "$LOG_DIR/pip-stack.log" \
    "${PIP[@]}" install -r "$ROOT/requirements/stack.txt" "${CONSTRAINTS[@]}"
  echo "$want" > "$stamp"
else
  echo "    unchanged since the last set-up"
fi

# Versions from package metadata (importing torch and mxnet would cost ~10 s on every set-up).
version_of() { "$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1').split('+')[0])"; }
TORCH_V=$(version_of torch)
MXNET_V=$(version_of mxnet)
WHEEL_DIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-torch$TORCH_V-mxnet$MXNET_V-py311"
horovod_stamp="$VENV/.bytesched-horovod"

say "Horovod $HOROVOD_VERSION with PyTorch, MXNet and Gloo (cache: $WHEEL_DIR)"
if [ "$(cat "$horovod_stamp" 2>/dev/null)" != "$WHEEL_DIR" ]; then
  "$VENV/bin/python" -c "import mxnet" >/dev/null 2>&1 \
    || { echo "[setup] FAILED: mxnet $MXNET_V does not import (it needs numpy < 1.24):" >&2;
         "$VENV/bin/python" -c "import mxnet" 2>&1 | tail -n 5 | sed 's/^/    /' >&2; exit 1; }
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "    no cached wheel: building from the PyPI sdist (about 4-6 minutes on 2 cores)"
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' EXIT
    run_logged "download horovod sdist" "$LOG_DIR/horovod-download.log" \
      "${PIP[@]}" download --no-deps --no-binary :all: -d "$build" "horovod==$HOROVOD_VERSION"
    tar -xzf "$build"/horovod-$HOROVOD_VERSION.tar.gz -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # PyTorch >= 2.1 headers need C++17; horovod 0.28.1 asks for C++14 in these two files.
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q "CMAKE_CXX_STANDARD 17" "$src/horovod/torch/CMakeLists.txt" \
      || { echo "[setup] FAILED: could not apply the C++17 fix to horovod's CMakeLists.txt" >&2; exit 1; }
    run_logged "horovod wheel build (log: $LOG_DIR/horovod-build.log)" "$LOG_DIR/horovod-build.log" \
      env -C "$src" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 MAKEFLAGS=-j2 \
        PATH="$VENV/bin:$PATH" \
        "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$build/wheel" .
    mkdir -p "$WHEEL_DIR"
    cp "$build"/wheel/horovod-*.whl "$WHEEL_DIR/"
  fi
  run_logged "install horovod wheel" "$LOG_DIR/horovod-install.log" \
    "${PIP[@]}" install --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
  check="$("$VENV/bin/horovodrun" --check-build 2>&1)" || true
  for want in PyTorch MXNet Gloo; do
    echo "$check" | grep -q "\[X\] $want" || {
      echo "[setup] FAILED: horovodrun --check-build does not list $want:" >&2
      echo "$check" | sed 's/^/    /' >&2; exit 1; }
  done
  echo "    horovodrun --check-build: PyTorch, MXNet, Gloo"
  echo "$WHEEL_DIR" > "$horovod_stamp"
else
  echo "    installed from the cached wheel and checked before"
fi

say "C++ libraries (csrc/: MXNet Dependency Proxies, emulated device, against the mxnet wheel; the native Scheduler and torch.distributed hot path, a torch extension)"
# csrc/build.py skips the compiler when source, command and libmxnet.so are unchanged; on failure
# it names what is missing (g++, the mxnet headers) or shows the compiler's error.
if ! csrc_out="$("$VENV/bin/python" "$ROOT/csrc/build.py" 2>&1)"; then
  echo "[setup] FAILED: building the C++ libraries in csrc/:" >&2
  echo "$csrc_out" | tail -n 30 | sed 's/^/    /' >&2
  exit 1
fi
echo "$csrc_out" | sed 's/^/    /'

say "bytesched (editable)"
# Installed means: the console script exists and, imported from outside the checkout (where the
# current directory cannot stand in for the install), bytesched resolves to this checkout.
if [ ! -x "$VENV/bin/bytesched" ] || ! (cd / && "$VENV/bin/python" -c \
     "import sys, bytesched; sys.exit(not bytesched.__file__.startswith('$ROOT/'))" >/dev/null 2>&1); then
  run_logged "pip install -e ." "$LOG_DIR/bytesched-install.log" \
    "${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"
else
  echo "    installed (editable) from $ROOT"
fi

say "done: activate with 'source $VENV/bin/activate'"
