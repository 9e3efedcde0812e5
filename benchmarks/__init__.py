"""The benchmarks and the quality evaluation: a package run as modules from the repository root.

    python -m benchmarks.bench_ops
"""

from __future__ import annotations

import pathlib

# No folder at the root is named quest_ort (docs/architecture.md), so with the root first on
# sys.path, as `python -m` puts it, `import quest_ort` still finds the installed package.
ROOT = pathlib.Path(__file__).resolve().parents[1]
