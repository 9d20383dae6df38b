"""Build the C++ libraries in csrc/ against the installed mxnet and torch wheels.

    python csrc/build.py            # build what is out of date, print each library's path
    python csrc/build.py --force    # rebuild

- ``csrc/proxies.cc``: the MXNet plugin's Dependency Proxies,
  ``bytesched/plugins/mxnet/libbytesched_mxnet.so``;
- ``csrc/emulated_device.cc``: the benchmark's emulated accelerator for MXNet,
  ``benchmarks/emulated/libbytesched_emulated_device.so``;
- ``csrc/torch_core.cc`` with ``scheduler.cc`` and ``order_link.cc``: the native Scheduler and
  the PyTorch plugin's hot path over torch.distributed, a torch extension module,
  ``bytesched/plugins/torch/_native<EXT_SUFFIX>``.

The mxnet wheel ships MXNet's headers (``mxnet/include``) and ``libmxnet.so``, the torch wheel
its headers (``torch/include``, pybind11's among them) and libraries (``torch/lib``); each
library is linked against those exact libraries (with an rpath to them) and written next to the
module that loads it (git-ignored). A stamp per library in ``build/csrc/`` holding the hash of
the sources, the compiler command and the linked library's identity makes a repeated set-up a
no-op. mxnet and torch are located without importing them (an import costs seconds).

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
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "csrc"  # stamps and partial outputs (build/ is git-ignored)

# MXNet's headers pull in mshadow; these select its CPU-only, BLAS-free configuration (the
# libraries use none of it, but the headers must parse).
DEFINES = ["-DMSHADOW_USE_CUDA=0", "-DMSHADOW_USE_MKL=0", "-DMSHADOW_USE_CBLAS=0", "-DDMLC_USE_CXX11=1"]


CSRC = ROOT / "csrc"


@dataclass(frozen=True)
class Target:
    """One library: its sources (the first names it in messages), the headers they include, where
    its loader expects it, and the framework it is built against (``mxnet`` or ``torch``)."""

    sources: tuple[Path, ...]
    output: Path
    framework: str = "mxnet"
    headers: tuple[Path, ...] = ()


PROXIES = Target((CSRC / "proxies.cc",), ROOT / "bytesched" / "plugins" / "mxnet" / "libbytesched_mxnet.so")
EMULATED_DEVICE = Target((CSRC / "emulated_device.cc",),
                         ROOT / "benchmarks" / "emulated" / "libbytesched_emulated_device.so")
TORCH_NATIVE = Target((CSRC / "torch_core.cc", CSRC / "scheduler.cc", CSRC / "order_link.cc"),
                      ROOT / "bytesched" / "plugins" / "torch" / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}",
                      "torch", (CSRC / "scheduler.h", CSRC / "order_link.h"))
TARGETS = (PROXIES, EMULATED_DEVICE, TORCH_NATIVE)


class BuildError(RuntimeError):
    """A prerequisite is missing or the compiler failed; the message says which."""


def package_dir(name: str, version: str, needed: tuple[str, ...]) -> Path:
    """The installed ``name`` package's directory (found without importing it, which costs
    seconds), holding every path in ``needed``; else :class:`BuildError` naming what to install."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise BuildError(f"{name} is not installed for {sys.executable}: install {name}=={version} "
                         "(scripts/setup.sh does)")
    package = Path(spec.origin).parent
    for path in needed:
        if not (package / path).exists():
            raise BuildError(f"{package / path} is missing: the {name} wheel should ship it "
                             f"(reinstall {name}=={version})")
    return package


def mxnet_dir() -> Path:
    """The installed mxnet package directory, with its headers and libmxnet.so."""
    return package_dir("mxnet", "1.9.1", ("include/mxnet/c_api.h", "libmxnet.so"))


def torch_dir() -> Path:
    """The installed torch package directory, with the headers and libraries an extension needs."""
    return package_dir("torch", "2.13.0", ("include/torch/csrc/distributed/c10d/ProcessGroup.hpp",
                                           "include/pybind11/pybind11.h", "lib/libtorch_python.so"))


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


def command(cxx: str, target: Target, package: Path, output: Path) -> list[str]:
    """The compile-and-link command line of ``target`` against ``package`` (its framework's)."""
    base = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wno-unknown-pragmas"]
    sources = [str(source) for source in target.sources]
    if target.framework == "torch":
        # A torch extension as torch.utils.cpp_extension would build one, without ninja: torch's
        # and Python's headers, linked against the wheel's libraries.
        include = package / "include"
        return [*base, f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
                f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=_native",
                "-DTORCH_API_INCLUDE_EXTENSION_H", "-fvisibility=hidden",
                "-o", str(output), *sources, f"-L{package / 'lib'}", "-lc10", "-ltorch", "-ltorch_cpu",
                "-ltorch_python", f"-Wl,-rpath,{package / 'lib'}"]
    return [*base, f"-I{package / 'include'}", *DEFINES, *mkldnn_defines(package), "-o", str(output), *sources,
            f"-L{package}", "-l:libmxnet.so", f"-Wl,-rpath,{package}"]


def linked_library(target: Target, package: Path) -> Path:
    """The framework library ``target`` links, whose identity its stamp records."""
    return package / "lib" / "libtorch_cpu.so" if target.framework == "torch" else package / "libmxnet.so"


def fingerprint(target: Target, argv: list[str], package: Path) -> str:
    """What a build depends on: sources and headers, command, and the framework library it links."""
    lib = linked_library(target, package).stat()
    digest = hashlib.sha256()
    for path in (*target.sources, *target.headers):
        digest.update(path.read_bytes())
    digest.update("\0".join(argv).encode())
    digest.update(f"{lib.st_size}:{lib.st_mtime_ns}".encode())
    return digest.hexdigest()


def build_target(target: Target, cxx: str, package: Path, force: bool) -> Path:
    """Build one library if it is missing or out of date; return its path."""
    argv = command(cxx, target, package, target.output)
    want = fingerprint(target, argv, package)
    stamp = WORK / f"{target.output.name.split('.')[0]}.stamp"
    if not force and target.output.exists() and stamp.exists() and stamp.read_text() == want:
        return target.output
    WORK.mkdir(parents=True, exist_ok=True)
    target.output.parent.mkdir(parents=True, exist_ok=True)
    partial = WORK / target.output.name
    argv_partial = command(cxx, target, package, partial)
    result = subprocess.run(argv_partial, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"compiling {target.sources[0]} failed:\n  {' '.join(argv_partial)}\n"
                         + result.stderr[-4000:])
    partial.replace(target.output)  # atomic: a concurrent loader never sees a half-written library
    stamp.write_text(want)
    return target.output


def build(force: bool = False) -> list[Path]:
    """Build every library that is missing or out of date; return their paths."""
    packages = {"mxnet": mxnet_dir(), "torch": torch_dir()}
    cxx = compiler()
    return [build_target(target, cxx, packages[target.framework], force) for target in TARGETS]


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
