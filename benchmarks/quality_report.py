"""Tables and plots of the quality evaluation (docs/quality.md between generated markers, PNGs)."""

from __future__ import annotations

import collections
import pathlib
import re

BEGIN, END = "<!-- BEGIN GENERATED: benchmarks/eval_quality.py -->", "<!-- END GENERATED -->"


def _pass_key_tables(report) -> list[str]:
    rows = report["pass_key"]
    dense_hit = {(r["length"], r["depth"], r["key"]): r["hit"] for r in rows if r["config"] == "dense"}
    lines = []
    for length in report["lengths"]:
        prompts = [k for k in dense_hit if k[0] == length]
        dense = sum(dense_hit[k] for k in prompts)
        lines += [f"**{length} tokens** (dense retrieves {dense} of {len(prompts)}): keys retrieved where dense "
                  "retrieves them / all keys", "",
                  "| policy | P | " + " | ".join(f"{b}" for b in report["budgets"]) + " |",
                  "|---|---|" + "---|" * len(report["budgets"])]
        table = collections.defaultdict(dict)
        for r in rows:
            if r["length"] != length or r["config"] == "dense":
                continue
            cell = table[(r["policy"], r["block_size"])].setdefault(r["budget"], [0, 0, 0])
            key = (r["length"], r["depth"], r["key"])
            cell[0] += r["hit"] and dense_hit[key]
            cell[1] += r["hit"]
            cell[2] += 1
        for (policy, block), cells in sorted(table.items()):
            values = [f"{cells[b][0]}/{dense} ({cells[b][1]}/{cells[b][2]})" if b in cells else "" for b in report["budgets"]]
            lines.append(f"| {policy} | {block} | " + " | ".join(values) + " |")
        lines.append("")
    return lines


def _recall_table(report) -> list[str]:
    rows = [r for r in report["pass_key"] if r["config"] != "dense" and r["recall"] is not None]
    means = collections.defaultdict(list)
    for r in rows:
        means[(r["policy"], r["block_size"], r["budget"])].append(r["recall"])
    lines = ["Attention-mass recall of the selected blocks at the first answer token (mean over prompts, "
             "sparse layers and KV heads):", "",
             "| policy | P | " + " | ".join(str(b) for b in report["budgets"]) + " |",
             "|---|---|" + "---|" * len(report["budgets"])]
    for policy, block in sorted({(p, b) for p, b, _ in means}):
        values = [f"{sum(means[(policy, block, b)]) / len(means[(policy, block, b)]):.3f}" if means[(policy, block, b)] else ""
                  for b in report["budgets"]]
        lines.append(f"| {policy} | {block} | " + " | ".join(values) + " |")
    return lines + [""]


def _perplexity_table(report) -> list[str]:
    dense = next(r["perplexity"] for r in report["perplexity"] if r["config"] == "dense")
    lines = [f"Perplexity over {report['perplexity_tokens']} tokens (dense: {dense:.3f}); in brackets the change "
             "relative to dense:", "",
             "| policy | P | " + " | ".join(str(b) for b in report["budgets"]) + " |",
             "|---|---|" + "---|" * len(report["budgets"])]
    table = collections.defaultdict(dict)
    for r in report["perplexity"]:
        if r["config"] != "dense":
            table[(r["policy"], r["block_size"])][r["budget"]] = r["perplexity"]
    for (policy, block), cells in sorted(table.items()):
        values = [f"{cells[b]:.3f} ({(cells[b] / dense - 1) * 100:+.1f}%)" if b in cells else "" for b in report["budgets"]]
        lines.append(f"| {policy} | {block} | " + " | ".join(values) + " |")
    return lines + [""]


def _plots(report, folder: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["pass_key"]
    dense_hit = {(r["length"], r["depth"], r["key"]): r["hit"] for r in rows if r["config"] == "dense"}
    fig, axes = plt.subplots(1, len(report["lengths"]), figsize=(5 * len(report["lengths"]), 4), sharey=True)
    for ax, length in zip(axes if len(report["lengths"]) > 1 else [axes], report["lengths"]):
        hits = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in rows:
            if r["length"] == length and r["config"] != "dense" and dense_hit[(r["length"], r["depth"], r["key"])]:
                hits[(r["policy"], r["block_size"])][r["budget"]].append(r["hit"])
        for (policy, block), cells in sorted(hits.items()):
            budgets = sorted(cells)
            ax.plot(budgets, [sum(cells[b]) / len(cells[b]) for b in budgets], marker="o",
                    linestyle="-" if block == 32 else "--", label=f"{policy} P={block}")
        ax.set(xscale="log", xlabel="budget (tokens)", title=f"pass key, {length}-token prompts")
    (axes[0] if len(report["lengths"]) > 1 else axes).set_ylabel("share of the keys dense retrieves")
    (axes[-1] if len(report["lengths"]) > 1 else axes).legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "quality_passkey.png", dpi=100)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    dense = next(r["perplexity"] for r in report["perplexity"] if r["config"] == "dense")
    series = collections.defaultdict(dict)
    for r in report["perplexity"]:
        if r["config"] != "dense":
            series[(r["policy"], r["block_size"])][r["budget"]] = r["perplexity"]
    for (policy, block), cells in sorted(series.items()):
        budgets = sorted(cells)
        ax.plot(budgets, [cells[b] for b in budgets], marker="o", linestyle="-" if block == 32 else "--",
                label=f"{policy} P={block}")
    ax.axhline(dense, color="black", linestyle=":", label="dense")
    ax.axhline(dense * 1.01, color="gray", linestyle=":", label="dense + 1%")
    ax.set(xscale="log", yscale="log", xlabel="budget (tokens)", ylabel="perplexity (log scale)",
           title="SmolLM2-135M, teacher-forced")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "quality_perplexity.png", dpi=100)


def write_report(report, folder: pathlib.Path, plots: bool = True) -> None:
    generated = [BEGIN, "", f"Model: {report['model']}; {report['keys']} keys per length and depth "
                 f"{list(report['depths'])}; sink 1 and recent 1 blocks; budgets in tokens (K x P). "
                 f"Run time {report['seconds']} s.", "", "### Pass-key retrieval", ""]
    generated += _pass_key_tables(report) + _recall_table(report)
    generated += ["### Perplexity", ""] + _perplexity_table(report)
    generated += ["![pass key](quality_passkey.png)", "", "![perplexity](quality_perplexity.png)", "", END]
    path = folder / "quality.md"
    text = path.read_text() if path.is_file() else "# Quality with real weights\n\n" + BEGIN + "\n" + END + "\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: "\n".join(generated), text))
    if plots:
        _plots(report, folder)
