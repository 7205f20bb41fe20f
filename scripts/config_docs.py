"""Writes docs/configuration.md from rpt/config.py: every field of the four config sections, with its type, default
and the comment beside it in the source; then the presets and what each sets.

    python scripts/config_docs.py            # rewrite docs/configuration.md
    python scripts/config_docs.py --check    # exit 1 if the page differs from what would be written

tests/test_docs.py checks that the page lists exactly the config's fields with their defaults.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rpt.config import CONFIG_DIR, PRESETS, RPTConfig, flat_config, shipped_configs  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"
SECTIONS = {"model": "ModelConfig", "data": "DataConfig", "train": "TrainConfig", "eval": "EvalConfig"}

INTRO = """\
# Configuration

One typed config (`rpt.config.RPTConfig`) holds everything a run needs, in four sections: `model`, `data`, `train`,
`eval`. It is saved with every checkpoint and every result file. Set any field from the command line with
`--set section.key=value` (repeatable), or in a YAML file given to `--config`; an unknown key or a value of the
wrong type is an error that names the key. A preset (`--preset NAME`) is a set of model and training fields; flags
and `--set` override it.

This page is generated from `rpt/config.py` by `python scripts/config_docs.py`; `tests/test_docs.py` fails when a
field or default here differs from the code.
"""

PARAMS = """
The counts below are printed by `pytest tests/model -k preset -s -n 0` (built on
the meta device, GPT-NeoX vocabulary 50,277 for the three paper-sized presets).

| preset | layers | D | heads | CCA layers | xl | retro | rpt-lex / rpt-sem | memorizing | block-recurrent | griffin |
|---|---|---|---|---|---|---|---|---|---|---|
| tiny (vocab 512) | 4 | 64 | 4 | 2, 3 | 0.2M | 0.3M | 0.3M | 0.2M | 0.3M | 0.2M |
| small (vocab 16,384) | 8 | 512 | 8 | 5, 6, 7 | 33.6M | 39.9M | 41.5M | 33.6M | 38.3M | 34.3M |
| 70m | 6 | 512 | 8 | 4, 5 | 44.6M | 49.9M | 51.5M | 44.6M | 49.4M | 45.1M |
| **250m** (the paper's model) | 12 | 1024 | 8 × 128 | 7–11 | **202.5M** | **236.1M** | **242.4M** | 202.5M | 220.3M | 206.4M |
| paper (Table 2) | | | | | 202M | 236M | 242M | 212M | 212M | 240M |
| 1b | 16 | 2048 | 16 | 8–15 | 908.6M | 1093.3M | 1118.4M | 908.6M | 977.8M | 919.5M |

The 250m counts land on the paper's because the retriever's chunk encoder, query augmentation, neighbour gating and
each CCA are single attention blocks (4D² each) and the query/key projections are D×D with bias; `retro` has no
chunk encoder and no projections. The baselines keep xl's width and depth, so that each differs from xl only in what
carries a document past the window: the memorizing layer adds one gate per head, the block-recurrent cell 8D² plus an
MLP and its state, Griffin's recurrent blocks replace attention in two layers of three. The paper's 212M for the first
two is not stated as a recipe; its Griffin row (240M) added 5 recurrent layers to xl, which `--set
model.n_layers=17 --set model.griffin.pattern=AAAAAAAAAAAARRRRR` builds (267.8M: each of our recurrent layers
brings its own MLP). xl + 2 layers (`--set model.n_layers=14`) is 227.6M against the paper's 228M.

"""


def comments(cls_name: str) -> dict[str, str]:
    """field -> the comments beside it in rpt/config.py: the line above (a block of # lines), the trailing one, and
    continuation lines below (indented past the `#`, or starting with "(")."""
    source = (ROOT / "rpt" / "config.py").read_text()
    lines = source.splitlines()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    out = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        i = node.lineno - 1
        block = []  # the comment lines right above the field
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# ---"):
            block.insert(0, lines[j].strip()[1:])
            j -= 1
        while block and (block[0].startswith("  ") or block[0].strip().startswith("(")):
            block.pop(0)  # the previous field's continuation lines, directly below it
        above = [text.strip() for text in block]
        trailing = lines[i].split("  # ", 1)[1].strip() if "  # " in lines[i] else ""
        below = []
        k = node.end_lineno
        while k < len(lines) and lines[k].strip().startswith("#"):
            text = lines[k].strip()[1:]
            if not (text.startswith("  ") or text.strip().startswith("(")):
                break
            below.append(text.strip())
            k += 1
        out[node.target.id] = " ".join([*above, trailing, *below]).strip()
    return out


def type_name(tp: object) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return re.sub(
        r"typing\.|Literal\[(.*)\]",
        lambda m: " | ".join(s.strip() for s in m.group(1).split(",")) if m.group(1) else "",
        str(text),
    )


def shown(config: dict, key: str) -> str:
    """The value of dotted `key` in a nested config dict, as JSON."""
    for part in key.split("."):
        config = config[part]
    return json.dumps(config)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    out = [INTRO]
    cfg = RPTConfig()
    for section, cls_name in SECTIONS.items():
        part = getattr(cfg, section)
        notes = comments(cls_name)
        doc = (type(part).__doc__ or "").strip().splitlines()[0]
        doc = re.sub(r",? ?DESIGN\.md §\d", "", doc)
        out += [f"## `{section}`", "", doc, "", "| field | type | default | meaning |", "|---|---|---|---|"]
        nested = []
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if dataclasses.is_dataclass(value):  # a nested section: one row per field, named model.cca.rel_bias
                nested.append((f"{section}.{f.name}", value))
                sub = comments(type(value).__name__)
                for g in dataclasses.fields(value):
                    out.append(f"| `{section}.{f.name}.{g.name}` | {cell(type_name(g.type))} | "
                               f"`{getattr(value, g.name)!r}` | {cell(sub.get(g.name, ''))} |")
                continue
            out.append(f"| `{section}.{f.name}` | {cell(type_name(f.type))} | `{value!r}` | {cell(notes.get(f.name, ''))} |")
        out.append("")
        for key, value in nested:
            settings = getattr(type(value), "SETTINGS", {})
            if not settings:
                continue
            doc = " ".join((type(value).__doc__ or "").split()).split(". Named settings")[0]
            out += [f"`{key}`: {doc}. A named setting selects the whole section (`{key}: NAME` in YAML, "
                    f"`--set {key}=NAME`); a field after it changes one (`--set {key}.FIELD=VALUE`):", ""]
            for name, fields in settings.items():
                sets = ", ".join(f"`{key}.{k}={json.dumps(v)}`" for k, v in fields.items()) or "the defaults above"
                out.append(f"- `{name}`: {sets}")
            out.append("")
    out += [
        "## Presets",
        "",
        "`--preset NAME` (or `RPTConfig.from_preset(NAME, variant=...)`) starts from the defaults above and sets:",
        "",
        "| preset | sets |",
        "|---|---|",
    ]
    for name, make in PRESETS.items():
        flat = flat_config(make())
        out.append(f"| `{name}` | {cell(', '.join(f'`{k}={shown(make(), k)}`' for k in flat))} |")
    out += ["", "Each preset is a YAML file in `rpt/configs/` (`tiny.yaml` ... `1b.yaml`). The paper's model as printed "
            "is any size with the named settings `paper` of `model.cca` and `model.gate` (`--preset tiny --set "
            "model.cca=paper --set model.gate=paper`; `rpt.config.PAPER_MODEL`).", "", "## Shipped configs", "",
            "`--config NAME` in `rpt train`, `prepare`, `label`, `dpr` and `eval` (or `rpt.train(NAME, ...)`) reads "
            "`rpt/configs/NAME.yaml`; `--config` also takes a YAML file or a run or checkpoint folder. `label` and "
            "`dpr` take the segment length, training span and store from it, and refuse a flag that contradicts it; "
            "`eval` takes its `eval` section as defaults. `rpt train --config NAME --print-config` prints the whole "
            "config.", "", "| config | what it is |", "|---|---|"]
    for name in shipped_configs():
        text = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()
        first = " ".join(line.lstrip("# ").strip() for line in text[:2] if line.startswith("#"))
        out.append(f"| `{name}` | {cell(first.split(': ')[0] if ': ' in first else first)} |")
    out += ["", "### Parameter counts", "", PARAMS.strip(), ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = PAGE.is_file() and PAGE.read_text() == text
        print(
            "docs/configuration.md is up to date" if same else "docs/configuration.md differs: run python scripts/config_docs.py"
        )
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
