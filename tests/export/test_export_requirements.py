"""`export-sparse` without the exporter's packages: one line naming them and the install command."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parents[2]

# export-sparse in a fresh interpreter where the comma-separated modules of argv[1] are missing: a
# None entry in sys.modules is what Python's import machinery reports as not installed (`import`
# raises ModuleNotFoundError, importlib.util.find_spec returns None), so transformers' own
# availability checks see them missing too.
_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from quest_ort.apps.export_cli import main
sys.exit(main(sys.argv[2:]))
"""


def _export_without(modules, args, cwd):
    return subprocess.run([sys.executable, "-c", _WITHOUT, ",".join(modules), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


CASES = {
    "hugging face export without torch": (["torch"], ["qwen3"], "torch"),
    "hugging face export without optimum-onnx": (["optimum.exporters.onnx"], ["llama"], "optimum-onnx"),
    "gguf export without gguf": (["gguf"], ["llama", "--model", "weights/model.gguf"], "gguf"),
    "gguf export without gguf and accelerate": (["gguf", "accelerate"], ["llama", "--model", "weights/model.gguf"],
                                                "gguf, accelerate"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_package_is_named_on_one_line_with_the_install_command(case, tmp_path):
    blocked, args, named = CASES[case]
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.gguf").write_bytes(b"")  # the GGUF cases' --model (never read)
    result = _export_without(blocked, [*args, "--k", "4", "-o", "out"], tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"export-sparse: error: the exporter needs {named}, not installed: "), lines[0]
    assert "pip install 'quest-ort[export]'" in lines[0]
    assert ("download.pytorch.org/whl/cpu" in lines[0]) == ("torch" in blocked)  # the CPU build, when torch is missing
    assert not (tmp_path / "out").exists()


def test_the_onnx_rewrite_needs_none_of_them(tmp_path):
    """Rewriting an exported graph uses the base install only: no torch asked for."""
    result = _export_without(["torch", "transformers", "optimum.exporters.onnx"],
                             ["onnx", "--model", "absent.onnx", "--k", "4"], tmp_path)
    assert result.returncode == 1
    assert "absent.onnx: no such ONNX file" in result.stderr and "not installed" not in result.stderr


def _export_extra() -> dict[str, Requirement]:
    listed = [Requirement(line) for line in importlib.metadata.requires("quest-ort") or []]
    return {r.name: r for r in listed if r.marker is not None and r.marker.evaluate({"extra": "export"})}


def test_the_export_extra_brings_every_package_the_check_names():
    from quest_ort.export import requirements

    assert set(requirements.MODULES) <= set(_export_extra())


def test_the_export_extra_pins_what_the_makefile_installs():
    """The Makefile's venv and `pip install 'quest-ort[export]'` get the same transformers and
    optimum-onnx (optimum-onnx 0.1.0 supports only transformers 4.57)."""
    makefile = (REPO / "Makefile").read_text()
    extra = _export_extra()
    for name in ("transformers", "optimum-onnx"):
        pinned = re.search(rf'"({re.escape(name)}[=<>!~][^"]*)"', makefile)
        assert pinned, f"the Makefile installs no pinned {name}"
        assert Requirement(pinned.group(1)).specifier == extra[name].specifier, name
