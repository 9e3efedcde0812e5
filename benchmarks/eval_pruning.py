"""`make eval-pruning`: how much of the block bounds a superblock pruning could leave unread on real caches, exactly or approximately, and what the approximate one keeps.

Issue 43 asks for hierarchical block bounds: bounds over superblocks of S consecutive blocks (the max
of their maxima, the min of their minima) whose Quest score bounds every block score inside, so
that SparseBlockSelect could skip, exactly, every superblock whose score cannot reach the K-th best
block score. What that can save depends on real keys and queries only, so this measures it before
any kernel is written:

- the default export of a real checkpoint (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct), a
  pass-key chat prompt of `--length` tokens prefilled exactly through `Generator`, then one decode
  step through a variant of the graph that also outputs every SparseBlockSelect's query;
- per sparse layer and query head (the default selects per query head): the block scores over the
  cache's own block bounds (the NumPy reference, `bound_scores`), the superblock bounds and their
  scores, and the K-th best block score;
- *must read*: the superblocks whose score reaches that K-th best score (exact pruning reads their
  fine bounds, and every superblock bound); *holding the top K*: the superblocks that hold one of
  the K best blocks (no superblock bound, however tight, lets an exact pruning skip these);
- *approximate*: what an approximate two-level selection would keep within the issue's byte
  budget (a quarter of the flat bound bytes): every superblock bound is read, then only the fine
  bounds of the superblocks ranked best by their own Quest score, as many as the rest of the budget
  holds (at least enough for K blocks), and the K best of their blocks are selected. *Recall* is the
  share of those K blocks whose score reaches the K-th best block score: 1 when the approximate
  selection equals the flat one (blocks of equal score, as the repeated caches' copies, count alike);
  *attention mass*: the share of the decode query's softmax attention (scale 1/sqrt(D), over the
  prompt's keys as the cache holds them) that the flat and the approximate selections' blocks hold.
  Its bytes count per query head; a kernel, which reads a KV head's bounds once for its group of
  query heads, would read the union of the group's candidates (*group bytes*);
- *design*: the two-level selection a kernel would build, whose bound reads count per KV head (a
  kernel reads a KV head's bounds once for its group of query heads): every superblock bound, then
  the fine bounds of CANDIDATES_PER_SELECTED x K blocks' worth of superblocks, shared by the group,
  its heads taking their best superblocks in turn; each head selects its K best blocks among them.
  Where those candidates would be every superblock it is the flat selection, exactly (below 16K
  tokens at the default K = 128, P = 8). Its recall and attention mass, per query head;
- longer contexts as the issue defines them: the prompt's cache repeated `--repeats` times (its
  block bounds tiled), the query the same.

Fractions are of the flat selection's bound reads (every block's bounds); forced sink and recent
blocks are left out (two blocks). Prints a table, writes benchmarks/results/pruning.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from . import quality_runtime as qr
from .eval_quality import reusable
from .quality_inputs import keys, pass_key_prompt

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "eval" / "pruning"
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ("smollm2", "qwen2.5-coder")
BUDGETS_IN_PAGES = (8, 32)  # --k 8 (256 tokens, the default until --k counted pages) and the default --k 32
SUPERBLOCKS = (8, 16, 32)  # blocks per superblock
REPEATS = (1, 4, 16)
APPROXIMATE_BYTES = 0.25  # the approximate selection's bound reads, a share of the flat selection's (issue 43)
CANDIDATES_PER_SELECTED = 16  # the design's candidate blocks per block selected (the 128K rows' ratio above)
QUERY_VARIANT = "model.select-queries.onnx"


def export_default(name: str, capacity: int) -> pathlib.Path:
    """The default export of checkpoint `name` under build/eval/pruning, reused when it is one."""
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import CHECKPOINTS, checkpoint
    from quest_ort.model_folder.sidecar import Sidecar
    from quest_ort.pipeline import export_sparse

    folder = WORK / name
    settings = SparseSettings.for_budget(32)
    if (folder / "quest_model.json").is_file() and reusable(Sidecar.read(folder), settings, capacity):
        return folder
    export_sparse(CHECKPOINTS[name].family, output=folder, settings=settings,
                  model=str(checkpoint(name, ROOT / "build" / "weights")), capacity=capacity, overwrite=True,
                  log=lambda *a, **k: None)
    return folder


def write_query_variant(folder: pathlib.Path) -> list[str]:
    """The export's graph with every SparseBlockSelect's query as an extra output, beside it; returns
    the query names in graph order (the sparse layers' order)."""
    import onnx

    model = onnx.load(str(folder / "model.quest.onnx"), load_external_data=False)
    names = [node.input[0] for node in model.graph.node if node.op_type == "SparseBlockSelect"]
    for name in names:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    onnx.save(model, str(folder / QUERY_VARIANT))
    return names


def decode_queries(folder: pathlib.Path, prompt: list[int], threads: int | None):
    """(per sparse layer: the decode step's query [H, D], the cache's block bounds [N, M, D] and the
    prompt's keys [N, T, D], as float32) after an exact prefill of `prompt` through Generator."""
    from quest_ort.runtime.generate import Generator, Sampling
    from quest_ort.runtime.model import QuestModel

    model = QuestModel(folder, threads=threads)
    generator = Generator(model)
    first = generator.generate([prompt], Sampling(max_new_tokens=1))[0][0]
    source = model.new_cache(1, len(prompt) + 1)
    qr.copy_prompt_state(generator.cache, source, 0, len(prompt))
    names = write_query_variant(folder)
    probe = QuestModel(folder, threads=threads, model_file=QUERY_VARIANT)
    cache = qr.sharing_cache(probe, source)
    qr.rebuild_bounds(probe, cache)
    outputs = probe._step.run(qr.decode_feeds(probe, cache, [first]))
    blocks = -(-len(prompt) // probe.sidecar.settings.block_size)
    layers = [layer for layer in cache.layers if layer.block_max is not None]
    return [(outputs[name][0, :, 0].astype(np.float32), layer.block_max[0, :, :blocks].astype(np.float32),
             layer.block_min[0, :, :blocks].astype(np.float32),
             qr.held_keys(layer, 0, len(prompt)).astype(np.float32)) for name, layer in zip(names, layers, strict=True)]


def superblock_bounds(block_max: np.ndarray, block_min: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """[ceil(M / size), D] maxima of the maxima and minima of the minima of `size` consecutive blocks
    (a partial last superblock over the blocks it has)."""
    blocks, pad = block_max.shape[0], -block_max.shape[0] % size
    top = np.concatenate([block_max, np.full((pad, block_max.shape[1]), -np.inf, np.float32)])
    bottom = np.concatenate([block_min, np.full((pad, block_min.shape[1]), np.inf, np.float32)])
    return top.reshape(-1, size, top.shape[1]).max(1), bottom.reshape(-1, size, bottom.shape[1]).min(1)


def head_scores(query: np.ndarray, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """The reference's Quest bound of one query row [D] over bounds [M, D]: [M]."""
    from quest_ort.ops.reference.sparse_block_select import bound_scores

    return bound_scores(query[None, None, None], top[None, None], bottom[None, None], 1, "none")[0, 0, 0]


def block_attention(query: np.ndarray, keys: np.ndarray, block_size: int) -> np.ndarray:
    """The softmax attention of one query row [D] over keys [T, D] (scale 1/sqrt(D)), summed per
    block of `block_size` tokens: [ceil(T / block_size)], summing to 1."""
    logits = keys @ query / np.sqrt(query.size)
    weights = np.exp(logits - logits.max())
    weights /= weights.sum()
    return np.add.reduceat(weights, np.arange(0, keys.shape[0], block_size))


def members_of(superblocks: np.ndarray, size: int, blocks: int) -> np.ndarray:
    """The blocks of `superblocks`, ascending (a partial last superblock's that exist)."""
    members = (superblocks[:, None] * size + np.arange(size)).reshape(-1)
    return members[members < blocks]


def approximate_selection(scores: np.ndarray, super_scores: np.ndarray, keep: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(the blocks the approximate selection picks, the blocks whose fine bounds it reads): the best
    superblocks by score (ties to the lower index) within APPROXIMATE_BYTES of the flat bytes, then
    the `keep` best of their blocks."""
    blocks = scores.size
    candidates = max(int((APPROXIMATE_BYTES * blocks - super_scores.size) // size), -(-keep // size))
    members = members_of(np.sort(np.argsort(-super_scores, kind="stable")[:candidates]), size, blocks)
    return members[np.argsort(-scores[members], kind="stable")[:keep]], members


def group_candidates(super_scores: list[np.ndarray], keep: int, size: int) -> np.ndarray | None:
    """The design's candidate superblocks of one KV head, ascending: CANDIDATES_PER_SELECTED * keep
    blocks' worth of superblocks, the group's heads taking their best in turn (each head's ranking by
    its own superblock score, ties to the lower index; one already taken is skipped). None when they
    would be every superblock (the flat selection, exactly). In turns rather than by the group's max
    score: a head whose bounds are small keeps its own best superblocks (at 128K, Qwen2.5-Coder's
    groups of 7 held 0.708 of the attention so, flat 0.703, against 0.681 by the max)."""
    count = -(-CANDIDATES_PER_SELECTED * keep // size)
    if count >= super_scores[0].size:
        return None
    rankings = np.stack([np.argsort(-scores, kind="stable") for scores in super_scores], axis=1)  # [rank, head]
    in_turn = rankings.reshape(-1)
    _, first = np.unique(in_turn, return_index=True)  # each superblock at its first turn
    return np.sort(in_turn[np.sort(first)[:count]])


def design_selection(heads, keep: int, size: int) -> tuple[int, list[np.ndarray]]:
    """(the blocks whose bounds the design reads, superblocks counted as blocks; each head's picks) for
    one KV head's `heads`: (block scores, superblock scores, the flat selection) each."""
    blocks, superblocks = heads[0][0].size, heads[0][1].size
    candidates = group_candidates([super_scores for _, super_scores, _ in heads], keep, size)
    if candidates is None:
        return blocks, [best for _, _, best in heads]
    members = members_of(candidates, size, blocks)
    return superblocks + members.size, [members[np.argsort(-scores[members], kind="stable")[:keep]]
                                        for scores, _, _ in heads]


def pruning(layers, top_k: int, size: int, repeats: int, block_size: int = 8) -> dict:
    """Fractions of the flat selection's bound reads, summed over layers and query heads (`layers`:
    (query, block maxima, block minima[, keys]) each; with keys, the attention mass the selections
    hold, averaged over layers and query heads). The design's fractions are per KV head, as a kernel
    reads bounds: once for the group's heads."""
    must, holding, superblocks, total = 0, 0, 0, 0
    recalled, selected, approximate_reads, flat_mass, approximate_mass, heads_seen = 0, 0, 0, 0.0, 0.0, 0
    design_reads, design_total, design_recalled, design_mass, union_reads = 0, 0, 0, 0.0, 0
    for query, block_max, block_min, *held in layers:
        heads, kv_heads = query.shape[0], block_max.shape[0]
        group = heads // kv_heads
        for n in range(kv_heads):
            top, bottom = np.tile(block_max[n], (repeats, 1)), np.tile(block_min[n], (repeats, 1))
            blocks = top.shape[0]
            keep = min(top_k, blocks)
            super_top, super_bottom = superblock_bounds(top, bottom, size)
            mass = None
            heads_of_group, read_by_group = [], np.zeros(0, np.int64)
            for h in range(n * group, (n + 1) * group):
                scores = head_scores(query[h], top, bottom)
                kth = np.partition(scores, blocks - keep)[blocks - keep]
                super_scores = head_scores(query[h], super_top, super_bottom)
                if np.any(np.repeat(super_scores, size)[:blocks] < scores):
                    raise AssertionError("a superblock score below one of its blocks' scores")
                best = np.argsort(-scores, kind="stable")[:keep]
                must += int((super_scores >= kth).sum()) * size
                holding += len(np.unique(best // size)) * size
                superblocks += super_scores.size
                total += blocks
                picked, read = approximate_selection(scores, super_scores, keep, size)
                recalled, selected = recalled + int((scores[picked] >= kth).sum()), selected + keep
                approximate_reads += read.size
                read_by_group = np.union1d(read_by_group, read)
                if held:  # the repeated cache's softmax gives each copy of a block 1/repeats of its mass
                    mass = np.tile(block_attention(query[h], held[0][n], block_size), repeats) / repeats
                    flat_mass += float(mass[best].sum())
                    approximate_mass += float(mass[picked].sum())
                    heads_seen += 1
                heads_of_group.append((scores, super_scores, kth, best, mass))
            reads, picks = design_selection([(g[0], g[1], g[3]) for g in heads_of_group], keep, size)
            design_total += blocks
            design_reads += reads
            union_reads += super_top.shape[0] + read_by_group.size
            for (scores, _, kth, _, mass), picked in zip(heads_of_group, picks, strict=True):
                design_recalled += int((scores[picked] >= kth).sum())
                if mass is not None:
                    design_mass += float(mass[picked].sum())
    masses = dict(flat_attention_mass=round(flat_mass / heads_seen, 4),
                  approximate_attention_mass=round(approximate_mass / heads_seen, 4),
                  design_attention_mass=round(design_mass / heads_seen, 4)) if heads_seen else {}
    return dict(must_read_fraction=round(must / total, 3), holding_top_k_fraction=round(holding / total, 3),
                bytes_fraction=round((must + superblocks) / total, 3),
                approximate_bytes_fraction=round((approximate_reads + superblocks) / total, 3),
                approximate_recall=round(recalled / selected, 4),
                approximate_group_bytes_fraction=round(union_reads / design_total, 3),
                design_bytes_fraction=round(design_reads / design_total, 3),
                design_recall=round(design_recalled / selected, 4), **masses)


def op_selection(layers, top_k: int, size: int, repeats: int, block_size: int = 8) -> dict:
    """What SparseBlockSelect itself keeps, flat and hierarchical (superblocks of `size` blocks, the
    default candidate_factor; docs/ops.md), on the repeated caches, with the default export's
    attributes (a list per query head, one sink and one recent block): the attention mass its blocks
    hold, averaged over layers and query heads, and the bound bytes it reads, of the flat ones."""
    from quest_ort.ops.reference.sparse_block_select import hierarchical_reads
    from quest_ort.ops.schemas import SPARSE_BLOCK_SELECT
    from quest_ort.runtime.single_op import run_op

    factor = SPARSE_BLOCK_SELECT.attribute("candidate_factor").default
    masses = {"flat": 0.0, "hierarchical": 0.0}
    heads_seen, reads, total = 0, 0, 0
    for query, block_max, block_min, keys in layers:
        heads, kv_heads = query.shape[0], block_max.shape[0]
        top, bottom = np.tile(block_max, (1, repeats, 1)), np.tile(block_min, (1, repeats, 1))
        blocks = top.shape[1]
        supers = [superblock_bounds(top[n], bottom[n], size) for n in range(kv_heads)]
        inputs = dict(query=query[None, :, None], block_max=top[None], block_min=bottom[None],
                      past_lens=np.array([blocks * block_size - 1], np.int32),
                      super_max=np.stack([t for t, _ in supers])[None], super_min=np.stack([b for _, b in supers])[None])
        attributes = dict(num_heads=heads, kv_num_heads=kv_heads, block_size=block_size, top_k=min(top_k, blocks),
                          group_reduce="none", superblock_size=size)
        flat_inputs = {k: v for k, v in inputs.items() if not k.startswith("super_")}
        flat_attributes = {k: v for k, v in attributes.items() if k != "superblock_size"}
        chosen = {"flat": run_op("SparseBlockSelect", flat_inputs, flat_attributes)["block_indices"][0, :, 0],
                  "hierarchical": run_op("SparseBlockSelect", inputs, attributes)["block_indices"][0, :, 0]}
        for h in range(heads):
            mass = np.tile(block_attention(query[h], keys[h // (heads // kv_heads)], block_size), repeats) / repeats
            for kind, rows in chosen.items():
                masses[kind] += float(mass[rows[h][rows[h] >= 0]].sum())
            heads_seen += 1
        hierarchical = hierarchical_reads(blocks - 1, min(top_k, blocks), size, factor)  # the query's own block is the last
        reads += kv_heads * (blocks if hierarchical is None else sum(hierarchical))
        total += kv_heads * blocks
    return dict(op_flat_attention_mass=round(masses["flat"] / heads_seen, 4),
                op_attention_mass=round(masses["hierarchical"] / heads_seen, 4),
                op_bytes_fraction=round(reads / total, 3))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, action="append", help="checkpoint (repeatable; default: both)")
    parser.add_argument("--length", type=int, default=8192, help="prompt tokens (default 8192)")
    parser.add_argument("--repeats", type=lambda text: tuple(int(r) for r in text.split(",")), default=REPEATS,
                        help="times the prompt's cache is repeated, comma-separated (default 1,4,16)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS / "pruning.json")
    args = parser.parse_args(argv)
    from quest_ort.model_folder.settings import top_k_for_budget
    from quest_ort.model_folder.sidecar import Sidecar

    report = dict(date=time.strftime("%Y-%m-%d"), length=args.length, superblocks=list(SUPERBLOCKS), models={})
    for name in args.model or MODELS:
        begin = time.time()
        folder = export_default(name, args.length + 256)
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(folder / "tokenizer")
        prompt = pass_key_prompt(tokenizer, keys(1, seed=args.length + 50)[0], args.length, 0.5, seed=0)
        layers = decode_queries(folder, prompt, args.threads)
        block_size = Sidecar.read(folder).settings.block_size
        rows = []
        for repeats in args.repeats:
            for pages in BUDGETS_IN_PAGES:
                top_k = top_k_for_budget(pages, block_size)
                for size in SUPERBLOCKS:
                    row = dict(context=len(prompt) * repeats, repeats=repeats, k=pages, top_k=top_k,
                               superblock_blocks=size, **pruning(layers, top_k, size, repeats, block_size),
                               **op_selection(layers, top_k, size, repeats, block_size))
                    rows.append(row)
                    print(f"{name} {row['context']:7d} tokens  --k {pages:2d} (K={top_k:3d})  S={size:2d}:  must read "
                          f"{row['must_read_fraction']:.3f}, holding the top K {row['holding_top_k_fraction']:.3f}, "
                          f"bytes with the superblocks {row['bytes_fraction']:.3f}; approximate: bytes "
                          f"{row['approximate_bytes_fraction']:.3f} (group {row['approximate_group_bytes_fraction']:.3f}), recall {row['approximate_recall']:.4f}; attention mass held: "
                          f"flat {row['flat_attention_mass']:.4f}, approximate {row['approximate_attention_mass']:.4f}; "
                          f"design: bytes {row['design_bytes_fraction']:.3f}, recall {row['design_recall']:.4f}, "
                          f"attention mass {row['design_attention_mass']:.4f}; the op: bytes "
                          f"{row['op_bytes_fraction']:.3f}, attention mass flat {row['op_flat_attention_mass']:.4f}, "
                          f"hierarchical {row['op_attention_mass']:.4f}", flush=True)
        report["models"][name] = dict(prompt_tokens=len(prompt), sparse_layers=len(layers),
                                      query_heads=int(layers[0][0].shape[0]), rows=rows,
                                      seconds=round(time.time() - begin))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
