"""Build the C++ libraries in csrc/ against the installed mxnet wheel.

    python csrc/build.py            # build what is out of date, print each library's path
    python csrc/build.py --force    # rebuild

- ``csrc/proxies.cc``: the MXNet plugin's Dependency Proxies,
  ``bytesched/plugins/mxnet/libbytesched_mxnet.so``;
- ``csrc/emulated_device.cc``: the benchmark's emulated accelerator for MXNet,
  ``benchmarks/emulated/libbytesched_emulated_device.so``.

The wheel ships MXNet's headers (``mxnet/include``) and ``libmxnet.so``; each library is linked
against that exact ``libmxnet.so`` (with an rpath to it) and written next to the module that
loads it (git-ignored). A stamp per library in ``build/csrc/`` holding the hash of the source,
the compiler command and libmxnet.so's identity makes a repeated set-up a no-op. mxnet is located
without importing it (an import costs seconds).

Exit status: 0 built or up to date; 1 a prerequisite is missing or the compiler failed (the
message names which).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import mmap
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "csrc"  # stamps and partial outputs (build/ is git-ignored)

# MXNet's headers pull in mshadow; these select its CPU-only, BLAS-free configuration (the
# libraries use none of it, but the headers must parse).
DEFINES = ["-DMSHADOW_USE_CUDA=0", "-DMSHADOW_USE_MKL=0", "-DMSHADOW_USE_CBLAS=0", "-DDMLC_USE_CXX11=1"]


@dataclass(frozen=True)
class Target:
    """One library: its source and where its loader expects it."""

    source: Path
    output: Path


PROXIES = Target(ROOT / "csrc" / "proxies.cc", ROOT / "bytesched" / "plugins" / "mxnet" / "libbytesched_mxnet.so")
EMULATED_DEVICE = Target(ROOT / "csrc" / "emulated_device.cc",
                         ROOT / "benchmarks" / "emulated" / "libbytesched_emulated_device.so")
TARGETS = (PROXIES, EMULATED_DEVICE)


class BuildError(RuntimeError):
    """A prerequisite is missing or the compiler failed; the message says which."""


def mxnet_dir() -> Path:
    """The installed mxnet package directory (found without importing mxnet)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or spec.origin is None:
        raise BuildError(f"mxnet is not installed for {sys.executable}: install mxnet==1.9.1 "
                         "(scripts/setup.sh does)")
    package = Path(spec.origin).parent
    header = package / "include" / "mxnet" / "c_api.h"
    library = package / "libmxnet.so"
    for needed in (header, library):
        if not needed.exists():
            raise BuildError(f"{needed} is missing: the mxnet wheel should ship it "
                             "(reinstall mxnet==1.9.1)")
    return package


def compiler() -> str:
    """The C++ compiler: $CXX, else g++ or c++ on PATH."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)  # type: ignore[return-value]
    raise BuildError("no C++ compiler found ($CXX, g++ or c++): install g++ "
                     "(Debian: apt-get install g++)")


MKLDNN_SYMBOL = b"_ZN5mxnet7NDArray20InvalidateMKLDNNDataEv"
"""A symbol only a libmxnet.so built with MKLDNN (oneDNN) exports."""


def mkldnn_defines(package: Path) -> list[str]:
    """The flags that make MXNet's headers declare what its library was built with: a wheel built
    with MKLDNN lays its NDArray chunks out with MKLDNN's fields, which the proxies' layout
    handling reads (csrc/proxies.cc, "MKLDNN layouts"); without it, none."""
    headers = package / "include" / "mkldnn"
    with open(package / "libmxnet.so", "rb") as library:
        with mmap.mmap(library.fileno(), 0, access=mmap.ACCESS_READ) as data:
            built_with = data.find(MKLDNN_SYMBOL) != -1
    if not built_with:
        return []
    if not (headers / "mkldnn.hpp").exists():
        raise BuildError(f"{package / 'libmxnet.so'} was built with MKLDNN but {headers} lacks mkldnn.hpp: "
                         "reinstall mxnet==1.9.1")
    return ["-DMXNET_USE_MKLDNN=1", f"-I{headers}"]


def command(cxx: str, package: Path, source: Path, output: Path) -> list[str]:
    """The compile-and-link command line."""
    return [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wno-unknown-pragmas",
            f"-I{package / 'include'}", *DEFINES, *mkldnn_defines(package), "-o", str(output), str(source),
            f"-L{package}", "-l:libmxnet.so", f"-Wl,-rpath,{package}"]


def fingerprint(source: Path, argv: list[str], package: Path) -> str:
    """What a build depends on: source, command, and the libmxnet.so it links."""
    lib = (package / "libmxnet.so").stat()
    digest = hashlib.sha256(source.read_bytes())
    digest.update("\0".join(argv).encode())
    digest.update(f"{lib.st_size}:{lib.st_mtime_ns}".encode())
    return digest.hexdigest()


def build_target(target: Target, cxx: str, package: Path, force: bool) -> Path:
    """Build one library if it is missing or out of date; return its path."""
    argv = command(cxx, package, target.source, target.output)
    want = fingerprint(target.source, argv, package)
    stamp = WORK / f"{target.output.stem}.stamp"
    if not force and target.output.exists() and stamp.exists() and stamp.read_text() == want:
        return target.output
    WORK.mkdir(parents=True, exist_ok=True)
    target.output.parent.mkdir(parents=True, exist_ok=True)
    partial = WORK / target.output.name
    argv_partial = command(cxx, package, target.source, partial)
    result = subprocess.run(argv_partial, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"compiling {target.source} failed:\n  {' '.join(argv_partial)}\n"
                         + result.stderr[-4000:])
    partial.replace(target.output)  # atomic: a concurrent loader never sees a half-written library
    stamp.write_text(want)
    return target.output


def build(force: bool = False) -> list[Path]:
    """Build every library that is missing or out of date; return their paths."""
    package = mxnet_dir()
    cxx = compiler()
    return [build_target(target, cxx, package, force) for target in TARGETS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    try:
        for path in build(force=args.force):
            print(path)
    except BuildError as error:
        print(f"csrc/build.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
