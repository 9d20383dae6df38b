"""csrc/build.py, the set-up's native build: a compiler error stops it and is shown, never a
silent fall-back to a slower path (scripts/setup.sh exits on its failure with its last lines)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO_ROOT

BUILD = REPO_ROOT / "csrc" / "build.py"


def build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("csrc_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("framework", ["mxnet", "torch"])
def test_a_compiler_error_stops_the_build_naming_the_source_and_the_error(tmp_path: Path, framework: str) -> None:
    build = build_module()
    broken = tmp_path / "broken.cc"
    broken.write_text("int bytesched_broken( {\n")
    target = build.Target((broken,), tmp_path / "libbroken.so", framework)
    package = build.torch_dir() if framework == "torch" else build.mxnet_dir()
    with pytest.raises(build.BuildError) as raised:
        build.build_target(target, build.compiler(), package, force=True)
    message = str(raised.value)
    assert f"compiling {broken} failed" in message and "broken.cc:1" in message  # the compiler's own words
    assert not target.output.exists()

