"""How the build finds ONNX Runtime's headers (CMakeLists.txt): the settings it takes and its message without them.

Each test configures the CMake project (about a second; no compilation). A machine without Debian's
archive is simulated by a PATH where every program is found but apt-get, so cmake/fetch_ort_headers.sh
fails as it does there; /usr/include/onnxruntime must be absent, as it is on such a machine.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = next(parent for parent in pathlib.Path(__file__).resolve().parents if (parent / "pyproject.toml").is_file())
HEADERS = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h")


def _tool(name: str) -> str | None:
    """The venv's own tool (make installs cmake and ninja from PyPI next to its python), else PATH's."""
    for candidate in (pathlib.Path(sys.executable).parent / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            try:
                subprocess.run([str(candidate), "--version"], capture_output=True, check=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue  # a shim with no program behind it (pyenv)
            return str(candidate)
    return None


CMAKE = _tool("cmake")
NINJA = _tool("ninja")

pytestmark = [
    pytest.mark.skipif(CMAKE is None, reason="no cmake (make installs it into .venv)"),
    pytest.mark.skipif(pathlib.Path("/usr/include/onnxruntime").exists(),
                       reason="/usr/include/onnxruntime exists: the build uses it and cannot fail"),
]


@pytest.fixture(scope="module")
def path_without_apt_get(tmp_path_factory) -> str:
    """A folder of links to every program on PATH (and to the venv's tools) except apt-get."""
    folder = tmp_path_factory.mktemp("bin")
    for directory in [str(pathlib.Path(CMAKE).parent), *os.environ.get("PATH", "").split(os.pathsep)]:
        if not os.path.isdir(directory):
            continue
        for entry in sorted(os.listdir(directory)):
            link = folder / entry
            if not entry.startswith("apt-get") and not os.path.lexists(link):
                link.symlink_to(os.path.join(directory, entry))
    assert shutil.which("apt-get", path=str(folder)) is None
    return str(folder)


def configure(tmp_path: pathlib.Path, path: str, *defines: str, ort_env: str | None = None):
    """cmake -S REPO on a fresh build tree, with PATH=path and ORT_INCLUDE_DIR as given (else unset)."""
    env = {key: value for key, value in os.environ.items() if key != "ORT_INCLUDE_DIR"}
    env["PATH"] = path
    if ort_env is not None:
        env["ORT_INCLUDE_DIR"] = ort_env
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}"] if NINJA else []
    command = [CMAKE, "-S", str(REPO), "-B", str(tmp_path / "build"), *generator, *defines]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout + run.stderr


def headers_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder laid out as a release archive's include/ (the configure step only checks the files exist)."""
    folder = tmp_path / "onnxruntime-linux-x64-1.21.0" / "include"
    folder.mkdir(parents=True)
    for header in HEADERS:
        (folder / header).write_text("// placeholder\n")
    return folder


def test_without_headers_or_debians_archive_the_error_says_how_to_point_at_them(tmp_path, path_without_apt_get):
    code, output = configure(tmp_path, path_without_apt_get)
    assert code != 0
    assert "apt-get not found" in output  # the Debian download was tried and failed
    message = " ".join(output[output.index("CMake Error"):].split())  # CMake wraps the prose
    assert "ORT_INCLUDE_DIR: not set" in message
    assert "onnxruntime_c_api.h and onnxruntime_cxx_api.h" in message
    assert "include/ folder of an ONNX Runtime release archive" in message
    assert "https://github.com/microsoft/onnxruntime/releases" in message
    # The two ways to pass the folder, each on a line of its own (indented, so CMake leaves it whole).
    lines = [line.strip() for line in output.splitlines()]
    assert "pip install . -C cmake.define.ORT_INCLUDE_DIR=/path/to/onnxruntime-linux-x64-1.21.0/include" in lines
    assert "ORT_INCLUDE_DIR=/path/to/onnxruntime-linux-x64-1.21.0/include pip install ." in lines


def test_a_setting_without_the_headers_is_named_in_the_warning_and_the_error(tmp_path, path_without_apt_get):
    wrong = tmp_path / "onnxruntime-linux-x64-1.21.0"  # the archive's root, not its include/
    wrong.mkdir()
    code, output = configure(tmp_path, path_without_apt_get, ort_env=str(wrong))
    assert code != 0
    flat = " ".join(output.split())
    assert f"ORT_INCLUDE_DIR='{wrong}' holds no onnxruntime_c_api.h" in flat
    assert f"ORT_INCLUDE_DIR: '{wrong}', which lacks them" in flat


@pytest.mark.parametrize("how", ["cmake-define", "environment"])
def test_both_ways_the_message_gives_are_taken(tmp_path, path_without_apt_get, how):
    """-C cmake.define.ORT_INCLUDE_DIR=... reaches CMake as -DORT_INCLUDE_DIR=...; the environment
    variable is read by CMakeLists.txt on a fresh build tree (pip install . always makes one)."""
    folder = headers_folder(tmp_path)
    if how == "cmake-define":
        code, output = configure(tmp_path, path_without_apt_get, f"-DORT_INCLUDE_DIR={folder}")
    else:
        code, output = configure(tmp_path, path_without_apt_get, ort_env=str(folder))
    assert code == 0, output
    assert f"ONNX Runtime headers: {folder}" in output
    assert "fetch_ort_headers" not in output  # the Debian download was not needed
