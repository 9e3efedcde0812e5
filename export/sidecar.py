"""The sidecar JSON next to an exported model: what the runtime needs to run it, and its provenance.

Written by `export-sparse`, read by `quest_ort.runtime`. Version it when the layout changes.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

SIDECAR_NAME = "quest_model.json"
FORMAT = "quest_ort.model/1"


@dataclasses.dataclass
class LayerIO:
    past_key: str
    past_value: str
    present_key: str
    present_value: str
    past_block_max: str | None = None
    past_block_min: str | None = None
    present_block_max: str | None = None
    present_block_min: str | None = None
    past_block_importance: str | None = None
    present_block_importance: str | None = None

    @property
    def sparse(self) -> bool:
        return self.past_block_max is not None


@dataclasses.dataclass
class Sidecar:
    model_file: str
    family: str
    source: str
    num_layers: int
    num_heads: int
    kv_num_heads: int
    head_dim: int
    vocab_size: int
    activation_dtype: str
    kv_dtype: str
    capacity: int
    block_size: int
    top_k: int
    sink_blocks: int
    recent_blocks: int
    group_reduce: str
    importance_fraction: float
    sparse_layers: list[int]
    dense_layers: list[int]
    layers: list[LayerIO]
    inputs: dict = dataclasses.field(default_factory=lambda: {
        "input_ids": "input_ids", "past_lens": "past_lens", "total_lens": "total_lens"})
    outputs: dict = dataclasses.field(default_factory=lambda: {"logits": "logits"})
    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    tokenizer: str | None = None  # a folder next to the model, relative, when the source had one
    attention: str = "quest"  # "quest", or "gqa" for the dense GroupQueryAttention baseline
    score: str = "bound"
    num_probes: int = 8
    portable: bool = False  # the Quest nodes are written as standard-op bodies: no op library needed
    bounds_dtype: str | None = None  # dtype of the block bounds; None (older exports): kv_dtype
    exporter: dict = dataclasses.field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def write(self, directory: pathlib.Path) -> None:
        (directory / SIDECAR_NAME).write_text(self.to_json() + "\n")

    @classmethod
    def read(cls, directory: pathlib.Path) -> Sidecar:
        path = pathlib.Path(directory) / SIDECAR_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: not a directory written by export-sparse")
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: format {data.get('format')!r}, this quest_ort reads {FORMAT!r}")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:  # nothing in a model folder may steer us beyond the known fields
            raise ValueError(f"{path}: unknown fields {sorted(unknown)}")
        for field in ("model_file", "tokenizer"):
            name = data.get(field)
            if name is not None and (not isinstance(name, str) or pathlib.PurePath(name).is_absolute()
                                     or ".." in pathlib.PurePath(name).parts or "\\" in name):
                raise ValueError(f"{path}: {field} {name!r} must be a relative path inside the model folder")
        data["layers"] = [LayerIO(**layer) for layer in data["layers"]]
        return cls(**data)

    @staticmethod
    def layer_io(layer: int, sparse: bool, importance: bool = False) -> LayerIO:
        io = LayerIO(f"past_key.{layer}", f"past_value.{layer}", f"present_key.{layer}", f"present_value.{layer}")
        if sparse:
            io.past_block_max, io.past_block_min = f"past_block_max.{layer}", f"past_block_min.{layer}"
            io.present_block_max, io.present_block_min = f"present_block_max.{layer}", f"present_block_min.{layer}"
            if importance:
                io.past_block_importance = f"past_block_importance.{layer}"
                io.present_block_importance = f"present_block_importance.{layer}"
        return io
