"""Standard-op function bodies of the Quest ops, one file per op, traced with onnxscript's builder.

Each body is `body(op, *inputs, **attributes)`: `op` is an onnxscript builder, absent optional
inputs are None, attributes are Python values. Python-level branches on attributes and input
presence keep each traced body free of control flow.
"""

from .quest_metadata import quest_metadata_body
from .sparse_block_attention import sparse_block_attention_body
from .sparse_block_select import sparse_block_select_body

BODIES = {
    "QuestMetadata": quest_metadata_body,
    "SparseBlockSelect": sparse_block_select_body,
    "SparseBlockAttention": sparse_block_attention_body,
}

__all__ = ["BODIES"]
