"""What onnxruntime-genai's model builder writes next to its model.onnx (`genai_config.json`) that the
export reads: the decoder's geometry (a cross-check of, or the fallback for, what the graph leaves
symbolic, such as the builder's `kv_cache_dim`), the context length and the EOS ids.

Only the fields read here are interpreted; the rest of the file (search options, session options,
provider options) is the builder's business and is ignored.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from .model_io import ExportError

FILE = "genai_config.json"


class GenaiConfigError(ExportError):
    """genai_config.json exists but is not what the builder writes; the message names the field."""


@dataclasses.dataclass(frozen=True)
class GenaiConfig:
    path: pathlib.Path
    head_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    num_hidden_layers: int | None
    context_length: int | None
    eos_token_ids: list[int]


def _positive(section: dict, name: str, path: pathlib.Path) -> int | None:
    value = section.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise GenaiConfigError(f"{path}: field {name!r} = {value!r}, expected a positive integer")
    return value


def read_genai_config(folder: pathlib.Path) -> GenaiConfig | None:
    """The config next to a builder's model (None when the folder has none)."""
    path = pathlib.Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GenaiConfigError(f"{path}: not readable JSON ({error})") from error
    model = document.get("model") if isinstance(document, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(decoder, dict):
        raise GenaiConfigError(f"{path}: no 'model.decoder' object, as onnxruntime-genai's builder writes")
    eos = model.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else eos
    if not isinstance(eos, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in eos):
        raise GenaiConfigError(f"{path}: field 'eos_token_id' = {model.get('eos_token_id')!r}, expected token ids")
    return GenaiConfig(path, _positive(decoder, "head_size", path), _positive(decoder, "num_attention_heads", path),
                       _positive(decoder, "num_key_value_heads", path), _positive(decoder, "num_hidden_layers", path),
                       _positive(model, "context_length", path), list(eos))
