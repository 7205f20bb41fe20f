"""Labelling throughput: BM25 candidates (ours vs bm25s vs rank_bm25) and the scorer (vs a plain forward).

    python benchmarks/bench_labels.py [--sizes 100000,1000000] [--scorer tiny|smollm2|NAME] [--device cpu|cuda]

The benchmark itself lives in lab/bench_labels.py (so `python -m lab bench` can import it); its docstring says
what each library is asked and how the comparison is kept fair. Run it alone: timings on a shared machine mean little.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lab.bench_labels import format_report, main, run_benchmark  # noqa: E402

__all__ = ["format_report", "main", "run_benchmark"]

if __name__ == "__main__":
    sys.exit(main())
