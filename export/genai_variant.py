"""The folder's onnxruntime-genai files: a variant of the graph genai's own og.Model / og.Generator
drive unmodified, its genai_config.json, the op library and the tokenizer beside them.

genai (0.18) feeds a decoder `input_ids`, `attention_mask` and the per-layer pairs it allocates and
keeps: past/present keys and values (one buffer bound as both when the capacity is a fixed dim, so
the ops write in place), and a "recurrent state" pair per layer (`past_conv_names`, rank 3, and
`past_recurrent_names`, rank 4, every dim but the batch fixed) that carries the block bounds of the
sparse layers. The variant is the exported graph with a preamble that derives the lengths the ops
take from the mask, as genai's own GroupQueryAttention models derive theirs, and the block max
folded to rank 3 around its op:

    attention_mask ─ReduceSum─Cast─ total_lens ─────────────────────────────┐
    input_ids ─Shape[1]─Cast─ new ─Sub(total_lens, new)─ past_lens ────────┼─ the exported nodes
                                  └─Greater(new, 1)─Where(total, past)─ exact_lens (a prompt attends exactly)
    past_lens ─Identity─ chunk_lens (no chunk query: genai prefills exactly)
    Constant 0 ─ logits_keep (every position's logits: genai picks the prompt's last row itself)
    past_block_max.l [B, N*M, D] ─Reshape─ [B, N, M, D] ─QuestMetadata─ [B, N, M, D] ─Reshape─ present_block_max.l

A row's lengths come from its mask, so one sequence per generator, or rows of one length (a padded
prompt gives a negative past length, which the ops refuse: an error, never a wrong answer). Written
for float caches; int8 caches are not (genai models a quantized cache its own way: no file is
written, and the export says why).
"""

from __future__ import annotations

import json
import pathlib
import shutil

GENAI_MODEL_FILE = "model.genai.onnx"
GENAI_CONFIG_FILE = "genai_config.json"
LIBRARY_FILE = "libquest_ort_ops.so"  # the op library's copy beside them
LENGTH_INPUTS = ("past_lens", "total_lens", "exact_lens", "chunk_lens", "logits_keep")  # what the preamble computes


def genai_refusal(sidecar) -> str | None:
    """Why this folder gets no genai files, or None."""
    if sidecar.settings.kv_dtype == "int8":
        return "int8 caches (onnxruntime-genai keeps quantized caches in its own layout)"
    if sidecar.settings.portable:
        return "a portable graph (it carries no op library; run it with ONNX Runtime directly)"
    if "exact_lens" not in sidecar.inputs:
        return "a graph without exact_lens"
    if sidecar.settings.importance:
        return "accumulated block importance (a third state per layer; genai carries two)"
    if sidecar.bounds_dtype == "int8":
        return "int8 block bounds (their per-block exponents are a third state per layer; genai carries two)"
    for index, layer in enumerate(sidecar.layers):
        expected = {role: f"{role}.{index}" for role in ("past_key", "past_value", "present_key", "present_value")}
        if layer.sparse:
            expected.update({role: f"{role}.{index}" for role in ("past_block_max", "past_block_min",
                                                                  "present_block_max", "present_block_min")})
        if any(getattr(layer, role) != name for role, name in expected.items()):
            return f"layer {index}'s cache names do not follow past_key.%d (genai finds layers by one pattern)"
    return None


def _fix_dims(value_info, dims) -> None:
    """Sets the fixed dims of a graph input or output (None keeps a dim as it is)."""
    for dim, size in zip(value_info.type.tensor_type.shape.dim, dims):
        if size is not None:
            dim.ClearField("dim_param")
            dim.dim_value = size


def _select_flat(graph, sidecar) -> None:
    """The graph's selections made flat, in place: genai carries two states per layer (the block
    bounds), so the variant drops the superblock bounds, their QuestMetadata nodes and the
    SparseBlockSelect inputs and attributes that take them (docs/ops.md: below candidate_factor * K
    blocks the two select the same blocks; past it the variant selects flat, exactly)."""
    from ..model_folder.sidecar import SUPER_BOUND_FIELDS, SUPER_EXPONENT_FIELDS
    from ..ops.schemas import SPARSE_BLOCK_SELECT

    first_super = SPARSE_BLOCK_SELECT.input_index("super_max")
    dropped = set()
    for node in graph.node:
        if node.op_type == "SparseBlockSelect":
            dropped.update(name for name in node.input[first_super:] if name)
            del node.input[first_super:]
            kept = [a for a in node.attribute if a.name not in ("superblock_size", "candidate_factor")]
            del node.attribute[:]
            node.attribute.extend(kept)
    producers = [node for node in graph.node if any(name in dropped for name in node.output)]
    states = {getattr(layer, field) for layer in sidecar.layers for field in SUPER_BOUND_FIELDS + SUPER_EXPONENT_FIELDS}
    for node in producers:
        graph.node.remove(node)
    for values in (graph.input, graph.output):
        for value in [v for v in values if v.name in states]:
            values.remove(value)


def genai_graph(graph_path: pathlib.Path, sidecar):
    """The genai variant of the exported graph (a ModelProto whose weights stay in the folder's data
    file: only the graph is read and written)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph_path), load_external_data=False)
    graph = model.graph
    if sidecar.settings.superblocks:
        _select_flat(graph, sidecar)
    geometry, capacity = sidecar.geometry, sidecar.capacity
    heads, size, blocks = geometry.kv_num_heads, geometry.head_dim, -(-capacity // sidecar.settings.block_size)
    inputs = [value for value in graph.input if value.name not in LENGTH_INPUTS]
    del graph.input[:]
    graph.input.extend(inputs)
    graph.input.insert(1, helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                        ["batch_size", "total_sequence_length"]))
    preamble = [
        helper.make_node("ReduceSum", ["attention_mask", "genai_axis_1"], ["genai_total_64"], keepdims=0),
        helper.make_node("Cast", ["genai_total_64"], ["total_lens"], to=TensorProto.INT32),
        helper.make_node("Shape", ["input_ids"], ["genai_new_64"], start=1, end=2),
        helper.make_node("Cast", ["genai_new_64"], ["genai_new"], to=TensorProto.INT32),
        helper.make_node("Sub", ["total_lens", "genai_new"], ["past_lens"]),
        helper.make_node("Greater", ["genai_new", "genai_one"], ["genai_prompt"]),
        helper.make_node("Where", ["genai_prompt", "total_lens", "past_lens"], ["exact_lens"]),
    ]
    if "chunk_lens" in sidecar.inputs:
        preamble.append(helper.make_node("Identity", ["past_lens"], ["chunk_lens"]))
    if "logits_keep" in sidecar.inputs:
        preamble.append(helper.make_node("Constant", [], ["logits_keep"],
                                         value=helper.make_tensor("genai_all_logits", TensorProto.INT64, [1], [0])))
    graph.initializer.extend([
        helper.make_tensor("genai_axis_1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("genai_one", TensorProto.INT32, [1], [1]),
        helper.make_tensor("genai_unfold", TensorProto.INT64, [4], [0, heads, blocks, size]),
        helper.make_tensor("genai_fold", TensorProto.INT64, [3], [0, heads * blocks, size]),
    ])
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past_key.", "past_value.", "present_key.", "present_value.")):
            _fix_dims(value, [None, heads, capacity, size])
        elif value.name.startswith(("past_block_min.", "present_block_min.")):
            _fix_dims(value, [None, heads, blocks, size])
    epilogue = []
    for layer in sidecar.sparse_layers:
        past, present = f"past_block_max.{layer}", f"present_block_max.{layer}"
        renamed = {past: past + ".unfolded", present: present + ".unfolded"}
        for node in graph.node:
            for i, name in enumerate(node.input):
                node.input[i] = renamed.get(name, name)
            for i, name in enumerate(node.output):
                node.output[i] = renamed.get(name, name)
        for values in (graph.input, graph.output):
            index, value = next((i, v) for i, v in enumerate(values) if v.name in renamed)
            folded = helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type,
                                                   ["batch_size", heads * blocks, size])
            values.remove(value)
            values.insert(index, folded)
        preamble.append(helper.make_node("Reshape", [past, "genai_unfold"], [renamed[past]]))
        epilogue.append(helper.make_node("Reshape", [renamed[present], "genai_fold"], [present]))
    nodes = [*preamble, *graph.node, *epilogue]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def genai_config(sidecar) -> dict:
    """genai_config.json: the decoder's I/O names and sizes, the op library, greedy by default."""
    geometry = sidecar.geometry
    eos = sidecar.eos_token_ids or [0]
    names = {"past_key_names": "past_key.%d", "past_value_names": "past_value.%d"}
    outputs = {"present_key_names": "present_key.%d", "present_value_names": "present_value.%d"}
    if sidecar.sparse_layers:
        names.update(past_conv_names="past_block_max.%d", past_recurrent_names="past_block_min.%d")
        outputs.update(present_conv_names="present_block_max.%d", present_recurrent_names="present_block_min.%d")
    return {
        "model": {
            "type": "decoder",
            "context_length": sidecar.capacity,
            "vocab_size": sidecar.vocab_size,
            "eos_token_id": eos if len(eos) > 1 else eos[0],
            "bos_token_id": eos[0],
            "pad_token_id": eos[0],
            "decoder": {
                "filename": GENAI_MODEL_FILE,
                "head_size": geometry.head_dim,
                "hidden_size": geometry.num_heads * geometry.head_dim,
                "num_attention_heads": geometry.num_heads,
                "num_key_value_heads": geometry.kv_num_heads,
                "num_hidden_layers": geometry.num_layers,
                # a name in the model folder: genai loads it from there, and refuses paths elsewhere
                "session_options": {"log_id": "quest-ort", "custom_ops_library": LIBRARY_FILE, "provider_options": []},
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", **names},
                "outputs": {"logits": sidecar.outputs.get("logits", "logits"), **outputs},
            },
        },
        "search": {"max_length": sidecar.capacity, "past_present_share_buffer": True, "do_sample": False,
                   "num_beams": 1, "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }



def write_genai_files(folder: pathlib.Path, sidecar, library: str) -> list[str]:
    """Writes the genai variant, its config, a copy of the op library `library` and the tokenizer
    files (genai's og.Tokenizer reads them beside its config) into `folder`; returns the names."""
    import onnx

    model = genai_graph(folder / sidecar.model_file, sidecar)
    onnx.save(model, str(folder / GENAI_MODEL_FILE))  # the initializers still name the folder's data file
    (folder / GENAI_CONFIG_FILE).write_text(json.dumps(genai_config(sidecar), indent=1) + "\n")
    shutil.copy2(library, folder / LIBRARY_FILE)
    written = [GENAI_MODEL_FILE, GENAI_CONFIG_FILE, LIBRARY_FILE]
    if sidecar.tokenizer is not None:
        for path in sorted((folder / sidecar.tokenizer).iterdir()):
            if not (folder / path.name).exists():
                shutil.copy2(path, folder / path.name)
                written.append(path.name)
    return written
