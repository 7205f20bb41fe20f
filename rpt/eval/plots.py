"""PNG plots of the §5.4 analyses from `rpt eval` result files: token overlap of the best neighbour (Fig.
"overlap_w_curr") and relative improvement over Transformer-XL with / without a gold chunk retrieved (Fig.
"imp_w_wo_corr_pred"). The supervision-quality curve (Fig. "scored_ds") is rpt.labels.quality's.

matplotlib is optional (`pip install 'rpt[plots]'`); figures are written with the Agg backend, no display needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rpt.utils import require, save_figure


def _pyplot():
    matplotlib = require("matplotlib", "plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(groups: Mapping[str, Mapping[str, float | None]], series: list[tuple[str, str]], path: str | Path, ylabel: str,
          title: str, zero_line: bool = False) -> Path:
    """Grouped bar chart: one group per key of `groups`, one bar per (key, label) of `series`."""
    plt = _pyplot()
    names = list(groups)
    x = np.arange(len(names))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(names) + 2), 3.5))
    for s, (key, label) in enumerate(series):
        vals = [groups[n].get(key) for n in names]
        ax.bar(x + (s - (len(series) - 1) / 2) * width, [np.nan if v is None else v for v in vals], width, label=label)
    if zero_line:
        ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(x, names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    return save_figure(fig, path)


def plot_token_overlap(overlaps: Mapping[str, Mapping[str, float | None]], path: str | Path,
                       title: str = "Unique-token overlap with the best neighbour") -> Path:
    """overlaps: retriever name -> {"query": mean overlap with the query chunk, "target": ... with the target chunk}."""
    return _bars(overlaps, [("query", "query chunk"), ("target", "target chunk")], path, "unique tokens in common", title)


def plot_subgroups(subgroups: Mapping[str, Mapping[str, Any]], path: str | Path,
                   title: str = "Relative improvement over Transformer-XL") -> Path:
    """subgroups: model name -> {"gold": {"improvement": ...}, "no_gold": {...}} (as in a result's "subgroups")."""
    flat = {name: {"gold": g["gold"]["improvement"], "no_gold": g["no_gold"]["improvement"]} for name, g in subgroups.items()}
    return _bars(flat, [("gold", "gold chunk retrieved"), ("no_gold", "no gold chunk retrieved")], path,
                 "mean 1 - NLL / NLL_xl per chunk", title, zero_line=True)


def result_name(result: Mapping[str, Any]) -> str:
    """A short label for a result: its variant, its neighbour source when not the model's own, and K."""
    ev, variant = result["eval"], result["config"]["model"]["variant"]
    default = {"xl": "none", "retro": "bm25"}.get(variant, "model")
    src = "" if ev["source"] == default else f" ({ev['source']})"
    return f"{variant}{src} K={ev['n_neighbors']}"


def plot_results(results: Mapping[str, Mapping[str, Any]] | list[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Every analysis plot the results allow, side by side across results (e.g. retro, rpt-lex, rpt-sem):
    token_overlap.png (each model's own retriever, and BM25 once) and subgroups.png. Returns the files written."""
    if not isinstance(results, Mapping):
        results = {result_name(r): r for r in results}
    out_dir = Path(out_dir)
    overlaps: dict[str, Mapping[str, float | None]] = {}
    subgroups: dict[str, Mapping[str, Any]] = {}
    for name, r in results.items():
        for retriever, ov in (r.get("overlap") or {}).items():
            if retriever == "definition":
                continue
            label = "BM25 (query c_q)" if retriever == "bm25" else f"{name} retriever"
            overlaps.setdefault(label, ov)  # BM25 is the same for every model on the same split: shown once
        if r.get("subgroups"):
            subgroups[name] = r["subgroups"]
    written = []
    if overlaps:
        written.append(plot_token_overlap(overlaps, out_dir / "token_overlap.png"))
    if subgroups:
        written.append(plot_subgroups(subgroups, out_dir / "subgroups.png"))
    return written
