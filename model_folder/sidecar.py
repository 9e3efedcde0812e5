"""The sidecar JSON next to an exported model: what the runtime needs to run it, and its provenance.

Written by `export-sparse`, read by `quest_ort.runtime`. Version it when the layout changes. In
Python a sidecar is composed of the folder's Geometry and SparseSettings (model_folder/settings.py);
its JSON keeps their fields flat beside the others (the layout of format quest_ort.model/1).
Fields added to format 1 since have defaults that say what their absence means; `weights` is
written only when it is not "float", so a float export's JSON is format 1's, bytes and all, for
readers that predate the field.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from ..ops.reference.sparse_block_select import most_chunk_forced
from ..ops.schemas import CACHE_TYPES, FLOAT_TYPES, SPARSE_BLOCK_SELECT
from .settings import CHUNK_SETTINGS, SUPERBLOCK_SETTINGS, WEIGHT_TYPES, Geometry, SparseSettings

SIDECAR_NAME = "quest_model.json"
FORMAT = "quest_ort.model/1"


class ModelFolderError(ValueError):
    """A model folder whose files cannot be read or disagree with each other; the message, one line,
    names the file, the field and what is wrong."""


# The caches of a layer, by role: LayerIO names each one's past input and present output.
CACHE_ROLES = ("key", "value", "block_max", "block_min", "block_importance", "key_scale", "value_scale",
               "block_exponent", "super_max", "super_min", "super_exponent")
# The row scales of int8 key and value caches: named only in folders whose kv_dtype is int8 (and
# left out of the JSON elsewhere, so float folders keep format 1's bytes).
SCALE_FIELDS = ("past_key_scale", "past_value_scale", "present_key_scale", "present_value_scale")
# The per-block exponents of int8 block bounds: named only by the sparse layers of folders whose
# bounds_dtype is int8 (and likewise left out of the JSON elsewhere).
EXPONENT_FIELDS = ("past_block_exponent", "present_block_exponent")
# The superblock bounds of the hierarchical selection: named only by the sparse layers of folders
# whose superblock_size is not 0 (the exponents with int8 bounds), and likewise left out elsewhere.
SUPER_BOUND_FIELDS = ("past_super_max", "past_super_min", "present_super_max", "present_super_min")
SUPER_EXPONENT_FIELDS = ("past_super_exponent", "present_super_exponent")
_OMITTED_WHEN_NONE = SCALE_FIELDS + EXPONENT_FIELDS + SUPER_BOUND_FIELDS + SUPER_EXPONENT_FIELDS


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
    past_key_scale: str | None = None
    past_value_scale: str | None = None
    present_key_scale: str | None = None
    present_value_scale: str | None = None
    past_block_exponent: str | None = None
    present_block_exponent: str | None = None
    past_super_max: str | None = None
    past_super_min: str | None = None
    present_super_max: str | None = None
    present_super_min: str | None = None
    past_super_exponent: str | None = None
    present_super_exponent: str | None = None

    @property
    def sparse(self) -> bool:
        return self.past_block_max is not None

    def present_to_past(self) -> dict[str, str]:
        """Each present output of the layer -> the past input it updates."""
        return {getattr(self, f"present_{role}"): getattr(self, f"past_{role}") for role in CACHE_ROLES
                if getattr(self, f"past_{role}") is not None}


_GEOMETRY_FIELDS = tuple(f.name for f in dataclasses.fields(Geometry))
# Every setting but track_importance, which the layers' importance caches say.
_SETTINGS_FIELDS = tuple(f.name for f in dataclasses.fields(SparseSettings) if f.name != "track_importance")
# The keys of the JSON object in the order format quest_ort.model/1 writes them.
_JSON_KEYS = ("model_file", "family", "source", "num_layers", "num_heads", "kv_num_heads", "head_dim", "vocab_size",
              "activation_dtype", "kv_dtype", "capacity", "block_size", "top_k", "sink_blocks", "recent_blocks",
              "group_reduce", "importance_fraction", "sparse_layers", "dense_layers", "layers", "inputs", "outputs",
              "eos_token_ids", "tokenizer", "attention", "score", "num_probes", "portable", "bounds_dtype", "weights",
              "key_smoothing", *CHUNK_SETTINGS, *SUPERBLOCK_SETTINGS, "exporter", "format")
# Fields older exports lack, and the values they mean there.
_JSON_DEFAULTS = {
    "inputs": lambda: {"input_ids": "input_ids", "past_lens": "past_lens", "total_lens": "total_lens"},
    "outputs": lambda: {"logits": "logits"},
    "eos_token_ids": list, "tokenizer": lambda: None, "attention": lambda: "quest", "score": lambda: "bound",
    "num_probes": lambda: 8, "portable": lambda: False, "bounds_dtype": lambda: None, "exporter": dict,
    "weights": lambda: "float", "key_smoothing": lambda: False,
    **{name: (lambda name=name: SPARSE_BLOCK_SELECT.attribute(name).default) for name in CHUNK_SETTINGS},
    # exports older than the hierarchical selection select flat
    "superblock_size": lambda: 0,
    "candidate_factor": lambda: SPARSE_BLOCK_SELECT.attribute("candidate_factor").default,
}
# Fields left out of the JSON when they hold their default (their absence says it).
_WRITTEN_UNLESS_DEFAULT = ("weights", "key_smoothing", *CHUNK_SETTINGS, *SUPERBLOCK_SETTINGS)


@dataclasses.dataclass
class Sidecar:
    model_file: str
    family: str
    source: str
    geometry: Geometry
    # As exported: kv_dtype resolved, dense_layers those the model has; bounds_dtype None in
    # exports older than the field (their bounds are kv_dtype: see `bounds_dtype` below).
    settings: SparseSettings
    vocab_size: int
    capacity: int
    sparse_layers: list[int]
    layers: list[LayerIO]
    inputs: dict = dataclasses.field(default_factory=_JSON_DEFAULTS["inputs"])
    outputs: dict = dataclasses.field(default_factory=_JSON_DEFAULTS["outputs"])
    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    tokenizer: str | None = None  # a folder next to the model, relative, when the source had one
    exporter: dict = dataclasses.field(default_factory=dict)
    format: str = FORMAT

    @property
    def bounds_dtype(self) -> str:
        """The block bounds' dtype (exports older than the field keep them in the caches' dtype)."""
        return self.settings.bounds_dtype or self.settings.kv_dtype

    def prefill_problem(self, mode: str) -> str | None:
        """Why this folder's graph cannot prefill in `mode` ("exact", "sparse", "per-token"), or None:
        an export older than the input the mode feeds. A graph without sparse layers (the
        GroupQueryAttention baseline, an all-dense export) attends exactly in every mode."""
        if self.settings.attention != "quest" or not self.sparse_layers:
            return None
        if mode == "exact" and "exact_lens" not in self.inputs:
            return ("was exported before exact prefill (its graph has no exact_lens input): export it again, or "
                    "prefill token by token (prefill='per-token')")
        if mode == "sparse" and "chunk_lens" not in self.inputs:
            return ("was exported before sparse prefill (its graph has no chunk_lens input): export it again "
                    "(export-sparse with the same options), or prefill exactly")
        return None

    def to_dict(self) -> dict:
        """The JSON object: the geometry's and settings' fields flat beside the others."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("geometry", "settings")}
        fields.update(dataclasses.asdict(self.geometry))
        fields.update({name: getattr(self.settings, name) for name in _SETTINGS_FIELDS})
        fields["dense_layers"] = list(self.settings.dense_layers)
        fields["layers"] = [{name: value for name, value in dataclasses.asdict(layer).items()
                             if value is not None or name not in _OMITTED_WHEN_NONE} for layer in self.layers]
        return {key: fields[key] for key in _JSON_KEYS
                if key not in _WRITTEN_UNLESS_DEFAULT or fields[key] != _JSON_DEFAULTS[key]()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write(self, directory: pathlib.Path) -> None:
        (directory / SIDECAR_NAME).write_text(self.to_json() + "\n")

    @classmethod
    def read(cls, directory: pathlib.Path) -> Sidecar:
        """The sidecar of a model folder, every field checked alone and against the others (the
        graph is checked against it when the runtime opens the folder: model_folder/folder_check.py)."""
        path = pathlib.Path(directory) / SIDECAR_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: not a directory written by export-sparse")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            # from None: the one-line message says it all; a parser traceback would bury it
            raise ModelFolderError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise ModelFolderError(f"{path}: must hold a JSON object, got a {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ModelFolderError(f"{path}: format {data.get('format')!r}, this quest_ort reads {FORMAT!r}")
        unknown = set(data) - set(_JSON_KEYS)
        if unknown:  # nothing in a model folder may steer us beyond the known fields
            raise ModelFolderError(f"{path}: unknown fields {sorted(unknown)}")
        missing = [name for name in _JSON_KEYS if name not in data and name not in _JSON_DEFAULTS]
        if missing:
            raise ModelFolderError(f"{path}: missing fields {missing}")
        for name, default in _JSON_DEFAULTS.items():  # fields older exports lack, checked like the rest
            if name not in data:
                data[name] = default()
        for field in ("model_file", "tokenizer"):
            name = data.get(field)
            if name is not None and (not isinstance(name, str) or pathlib.PurePath(name).is_absolute()
                                     or ".." in pathlib.PurePath(name).parts or "\\" in name):
                raise ModelFolderError(f"{path}: {field} {name!r} must be a relative path inside the model folder")
        _check_fields(data, lambda field, text: ModelFolderError(f"{path}: {field} {text}"))
        geometry = Geometry(**{name: data.pop(name) for name in _GEOMETRY_FIELDS})
        settings = {name: data.pop(name) for name in _SETTINGS_FIELDS}
        settings["dense_layers"] = tuple(settings["dense_layers"])
        data["layers"] = [LayerIO(**layer) for layer in data["layers"]]
        settings["track_importance"] = tracks_importance(data["layers"])
        settings = SparseSettings(**settings)
        return cls(geometry=geometry, settings=settings, **data)

    @staticmethod
    def layer_io(layer: int, sparse: bool, importance: bool = False, int8: bool = False,
                 int8_bounds: bool = False, superblocks: bool = False) -> LayerIO:
        io = LayerIO(f"past_key.{layer}", f"past_value.{layer}", f"present_key.{layer}", f"present_value.{layer}")
        if int8:
            for field in SCALE_FIELDS:
                setattr(io, field, f"{field}.{layer}")
        if sparse:
            io.past_block_max, io.past_block_min = f"past_block_max.{layer}", f"past_block_min.{layer}"
            io.present_block_max, io.present_block_min = f"present_block_max.{layer}", f"present_block_min.{layer}"
            if int8_bounds:
                io.past_block_exponent, io.present_block_exponent = (f"past_block_exponent.{layer}",
                                                                     f"present_block_exponent.{layer}")
            if superblocks:
                for field in SUPER_BOUND_FIELDS + (SUPER_EXPONENT_FIELDS if int8_bounds else ()):
                    setattr(io, field, f"{field}.{layer}")
            if importance:
                io.past_block_importance = f"past_block_importance.{layer}"
                io.present_block_importance = f"present_block_importance.{layer}"
        return io


def tracks_importance(layers: list[LayerIO]) -> bool:
    """Whether the folder carries block importance (its settings' track_importance)."""
    return any(io.past_block_importance is not None for io in layers)


# The sidecar's Quest settings are SparseBlockSelect attributes of the same names: their ranges and
# choices come from the op schema, so the sidecar accepts exactly what the ops accept.
_SELECT_FIELDS = ("num_heads", "kv_num_heads", "block_size", "top_k", "sink_blocks", "recent_blocks", "num_probes",
                  "group_reduce", "score", "importance_fraction", *CHUNK_SETTINGS, "candidate_factor")
_POSITIVE_FIELDS = ("num_layers", "head_dim", "vocab_size", "capacity")
_CHOICES = {"activation_dtype": FLOAT_TYPES, "kv_dtype": CACHE_TYPES, "attention": ("quest", "gqa")}
_STRING_FIELDS = ("model_file", "family", "source")
_INPUT_ROLES, _OUTPUT_ROLES = ("input_ids", "past_lens", "total_lens"), ("logits",)
_OPTIONAL_INPUT_ROLES = ("exact_lens", "chunk_lens", "logits_keep")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(data: dict, problem) -> None:
    """Raise problem(field, text) for the first field of a sidecar's JSON that is malformed or
    contradicts another field (before anything is built from it)."""
    def integer(field, minimum):
        value = data[field]
        if not _is_int(value) or value < minimum:
            raise problem(field, f"must be an integer >= {minimum:g}, got {value!r}")

    for field in _POSITIVE_FIELDS:
        integer(field, 1)
    size = data["superblock_size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 2**31 - 1:
        raise problem("superblock_size", f"must be 0 (flat) or a number of blocks, got {size!r}")
    if size and data["score"] == "probe":
        raise problem("superblock_size", f"must be 0 with score 'probe' (it reads keys, not bounds), got {size}")
    for field in _SELECT_FIELDS:  # the op's own ranges (ops/schemas.py), as the exporter checks them
        spec = SPARSE_BLOCK_SELECT.attribute(field)
        value = data[field]
        if spec.kind == "string":
            if value not in spec.choices:
                raise problem(field, f"must be one of {list(spec.choices)}, got {value!r}")
        elif (why := spec.range_problem(value)) is not None:
            raise problem(field, why)
    most = most_chunk_forced(data["chunk_size"], data["block_size"], data["chunk_window"], data["chunk_sink"])
    if data["chunk_top_k"] < most:
        raise problem("chunk_top_k", f"= {data['chunk_top_k']} cannot hold a prefill chunk's forced blocks: up to {most}")
    if data["num_heads"] % data["kv_num_heads"]:
        raise problem("num_heads", f"= {data['num_heads']} is not a multiple of kv_num_heads = {data['kv_num_heads']}")
    for field, choices in {**_CHOICES, "bounds_dtype": (None, *CACHE_TYPES), "weights": WEIGHT_TYPES}.items():
        if data[field] not in choices:
            raise problem(field, f"must be one of {list(choices)}, got {data[field]!r}")
    for field in _STRING_FIELDS:
        if not isinstance(data[field], str) or not data[field]:
            raise problem(field, f"must be a non-empty string, got {data[field]!r}")
    for field in ("portable", "key_smoothing"):
        if not isinstance(data[field], bool):
            raise problem(field, f"must be true or false, got {data[field]!r}")
    if data["key_smoothing"] and data["kv_dtype"] != "int8":
        raise problem("key_smoothing", f"is true, but kv_dtype is {data['kv_dtype']!r}: only int8 caches are smoothed")
    if not isinstance(data["exporter"], dict):
        raise problem("exporter", f"must be an object, got {data['exporter']!r}")
    _check_layers(data, problem)
    _check_roles(data, problem)
    eos = data["eos_token_ids"]
    if not isinstance(eos, list) or not all(_is_int(t) and 0 <= t < data["vocab_size"] for t in eos):
        raise problem("eos_token_ids", f"must be a list of token ids in [0, {data['vocab_size']}), got {eos!r}")


def _check_layers(data: dict, problem) -> None:
    """Layer lists and per-layer cache names: every layer dense or sparse, its caches complete and
    every name used once (a name given twice would bind two caches to one buffer)."""
    count = data["num_layers"]
    chosen = {}
    for field in ("sparse_layers", "dense_layers"):
        value = data[field]
        if not isinstance(value, list) or not all(_is_int(layer) and 0 <= layer < count for layer in value):
            raise problem(field, f"must be a list of layer numbers in [0, {count}), got {value!r}")
        chosen[field] = set(value)
    if chosen["sparse_layers"] & chosen["dense_layers"] or chosen["sparse_layers"] | chosen["dense_layers"] != set(
            range(count)):
        raise problem("sparse_layers", f"{data['sparse_layers']} and dense_layers {data['dense_layers']} must split "
                      f"the {count} layers between them")
    layers = data["layers"]
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise problem("layers", f"must be a list of objects, got {layers!r:.80}")
    if len(layers) != count:
        raise problem("layers", f"describes {len(layers)} layers, but num_layers is {count}")
    names = {f.name for f in dataclasses.fields(LayerIO)}
    required = [f.name for f in dataclasses.fields(LayerIO) if f.default is dataclasses.MISSING]
    seen = {}
    for index, layer in enumerate(layers):
        where = f"layers[{index}]"
        if set(layer) - names:
            raise problem(where, f"has unknown fields {sorted(set(layer) - names)}")
        if [name for name in required if name not in layer]:
            raise problem(where, f"lacks {[name for name in required if name not in layer]}")
        for field, name in layer.items():
            if name is not None and (not isinstance(name, str) or not name):
                raise problem(f"{where}.{field}", f"must be an input or output name, got {name!r}")
            if name is not None and name in seen:
                raise problem(f"{where}.{field}", f"names {name!r} twice (also {seen[name]})")
            seen[name] = f"{where}.{field}"
        io = LayerIO(**layer)
        bounds = [io.past_block_max, io.past_block_min, io.present_block_max, io.present_block_min]
        importance = [io.past_block_importance, io.present_block_importance]
        if any(name is None for name in bounds) != all(name is None for name in bounds):
            raise problem(where, "must name all four block bound caches (past and present max and min) or none")
        if any(name is None for name in importance) != all(name is None for name in importance):
            raise problem(where, "must name both block importance caches (past and present) or neither")
        scales = [getattr(io, field) for field in SCALE_FIELDS]
        if any(name is None for name in scales) != (data["kv_dtype"] != "int8"):
            raise problem(where, f"must name the four scale caches (past and present key and value) exactly when "
                          f"kv_dtype is int8, got kv_dtype {data['kv_dtype']!r}")
        exponents = [getattr(io, field) for field in EXPONENT_FIELDS]
        int8_bounds = io.sparse and (data["bounds_dtype"] or data["kv_dtype"]) == "int8"
        if any(name is None for name in exponents) == int8_bounds:
            raise problem(where, "must name both block exponent caches (past and present) exactly when it is sparse "
                          f"and bounds_dtype is int8, got bounds_dtype {data['bounds_dtype']!r}")
        supers = [getattr(io, field) for field in SUPER_BOUND_FIELDS]
        hierarchical = io.sparse and data["superblock_size"] > 0
        if any(name is None for name in supers) != all(name is None for name in supers):
            raise problem(where, "must name all four superblock bound caches (past and present max and min) or none")
        if (supers[0] is not None) != hierarchical:
            raise problem(where, "must name the superblock bound caches exactly when it is sparse and superblock_size "
                          f"is not 0, got superblock_size {data['superblock_size']!r}")
        super_exponents = [getattr(io, field) for field in SUPER_EXPONENT_FIELDS]
        if any(name is None for name in super_exponents) == (hierarchical and int8_bounds):
            raise problem(where, "must name both superblock exponent caches (past and present) exactly when it selects "
                          "hierarchically with int8 bounds")
        if importance[0] is not None and not io.sparse:
            raise problem(where, "has block importance caches but no block bounds: only sparse layers select")
        if io.sparse != (index in chosen["sparse_layers"]):
            raise problem(where, f"{'has' if io.sparse else 'has no'} block bounds, but sparse_layers is "
                          f"{data['sparse_layers']}")


def _check_roles(data: dict, problem) -> None:
    """The names the runtime feeds (input_ids, past_lens, total_lens, exact_lens, chunk_lens, logits_keep)
    and reads (logits)."""
    for field, required, optional in (("inputs", _INPUT_ROLES, _OPTIONAL_INPUT_ROLES), ("outputs", _OUTPUT_ROLES, ())):
        value = data[field]
        if not isinstance(value, dict):
            raise problem(field, f"must be an object, got {value!r}")
        if set(required) - set(value) or set(value) - set(required) - set(optional):
            raise problem(field, f"must map {list(required)}{f' (and optionally {list(optional)})' if optional else ''}"
                          f" to names, got {sorted(value)}")
        for role, name in value.items():
            if not isinstance(name, str) or not name:
                raise problem(f"{field}.{role}", f"must be a name, got {name!r}")
