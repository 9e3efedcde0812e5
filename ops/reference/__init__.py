"""NumPy references of the Quest operators: the contract every kernel and function body must meet."""

from .quest_metadata import quest_metadata
from .sparse_block_attention import sparse_block_attention
from .sparse_block_select import sparse_block_select

REFERENCES = {
    "QuestMetadata": quest_metadata,
    "SparseBlockSelect": sparse_block_select,
    "SparseBlockAttention": sparse_block_attention,
}

__all__ = ["REFERENCES", "quest_metadata", "sparse_block_attention", "sparse_block_select"]
