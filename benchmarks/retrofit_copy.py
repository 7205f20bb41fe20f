"""Can a retrofit read what its neighbours say? A far-copy corpus of real code in the backbone's own tokens, and the
perplexity of its repeated passages with BM25's neighbours, random chunks of the same document and none.

    python benchmarks/retrofit_copy.py corpus --tokenizer FOLDER/tokenizer.json --out copy.jsonl
    rpt prepare --corpus copy.jsonl --tokenizer FOLDER --out STORE
    rpt label --store STORE --split train --kind lex --span 1024 --segment-len 128 --k 20
    rpt train --preset tiny --variant retro --backbone FOLDER --store STORE --labels STORE/labels/train-lex-1024 \
        --seq-len 1024 --batch-size 1 --steps 300 --lr 1e-3 --set 'model.cca_layers=[24,27]' --out RUN ...
    rpt eval --checkpoint RUN --store STORE --split test --source bm25 --per-chunk --out EVAL/RUN-bm25.json  # random, none
    python benchmarks/retrofit_copy.py summary EVAL/*.json --out result.json

Each document is one 1,024-token training span of real code (the Python standard library's modules, cut into
64-token passages at random offsets): six fresh passages (tokens 0-383), four fresh passages as a spacer (384-639),
then the first six again in a shuffled order (640-1,023). A repeat starts at least 256 tokens after its source ends,
beyond a window of segments of 128 (a token sees 129 to 256 tokens back), so only retrieval can bring the source
back; passages end wherever the tokenizer puts them, so repeats sit at any offset to the 64-token chunk grid. Train
and test documents cut different modules (the first 40 modules by a seeded shuffle are the test split's).

`summary` reads `rpt eval --per-chunk` results and gives the perplexity over chunks 1-9 (fresh text: nothing to copy)
and over chunks 11-14 (tokens 704-959: repeats: every token's source is in an earlier passage), per result. A reader that copies
lowers the second with BM25's neighbours (which find the source passage) and not with random chunks of the document.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PASSAGE = 64
FRESH, SPACER = 6, 4
TEST_MODULES = 40
FRESH_CHUNKS, REPEAT_CHUNKS = range(1, 10), range(11, 15)


def _passage(ids: list[int], rng: random.Random) -> list[int]:
    s = rng.randrange(0, len(ids) - PASSAGE)
    return ids[s: s + PASSAGE]


def document(ids: list[int], rng: random.Random) -> list[list[int]]:
    """One document's passages of token ids: FRESH fresh, SPACER fresh, the first FRESH again in a shuffled order."""
    fresh = [_passage(ids, rng) for _ in range(FRESH)]
    spacer = [_passage(ids, rng) for _ in range(SPACER)]
    repeats = fresh[:]
    rng.shuffle(repeats)
    return fresh + spacer + repeats


def corpus(tokenizer: str, out: Path, n_train: int, n_test: int, seed: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
    rng = random.Random(seed)
    rng.shuffle(modules)
    parts = {"test": modules[:TEST_MODULES], "train": modules[TEST_MODULES:]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as fh:
        for split, n in (("train", n_train), ("test", n_test)):
            ids = [t for m in parts[split] for t in tok.encode(m.read_text(errors="ignore")).ids]

            for d in range(n):
                text = "".join(tok.decode(p) for p in document(ids, rng))
                fh.write(json.dumps({"id": f"{split}-{d:04d}", "split": split, "text": text}) + "\n")
    tmp.replace(out)
    print(f"{out}: {n_train} train and {n_test} test documents from {root}")


def _region_sums(path: str) -> list[dict[str, tuple[float, int]]]:
    """Per document of one `rpt eval --per-chunk` result: (NLL sum, tokens) over its fresh, repeat and all chunks."""
    r = json.loads(Path(path).read_text())
    docs = []
    for doc in r["documents"]:
        if "chunks" not in doc:
            sys.exit(f"{path}: no per-chunk data (rpt eval --per-chunk)")
        nll, tokens = doc["chunks"]["nll"], doc["chunks"]["tokens"]
        regions = {"fresh": FRESH_CHUNKS, "repeat": REPEAT_CHUNKS, "all": range(len(nll))}
        docs.append({k: (sum(nll[c] for c in cs), sum(tokens[c] for c in cs)) for k, cs in regions.items()})
    return docs


def _ratio(num: list[list[dict]], den: list[list[dict]], region: str) -> dict[str, float]:
    """exp(sum of num's region NLL - sum of den's) / tokens: each side a list of results (per document) whose NLL is
    added, scored on the same tokens; with one result a side, ppl(num) / ppl(den). The 95% interval resamples the
    documents (`lab.compare.bootstrap_ratio`, one run)."""
    from lab.compare import bootstrap_ratio

    tokens = [d[region][1] for d in num[0]]
    if any([d[region][1] for d in r] != tokens for r in num + den):
        sys.exit("results compared per document must score the same tokens (the same test split and store)")

    def per_doc(side: list[list[dict]]) -> dict[int, tuple[float, int]]:
        return {i: (sum(r[i][region][0] for r in side), n) for i, n in enumerate(tokens)}

    a, b = per_doc(num), per_doc(den)
    ratio = math.exp((sum(v for v, _ in a.values()) - sum(v for v, _ in b.values())) / sum(n for _, n in a.values()))
    low, high, _ = bootstrap_ratio({0: a}, {0: b})
    return {"ratio": ratio, "low": low, "high": high}


def summary(results: list[str], out: str | None, against: str | None = None) -> None:
    """Perplexity per region of each result, and per run (results named RUN-SOURCE.json) the repeat region's
    perplexity with random chunks and with none over that with BM25's neighbours; `against` a run: each other run's
    random-over-BM25 ratio over that run's, paired by document."""
    rows = {Path(p).stem: _region_sums(p) for p in results}
    table = {name: {k: {"nll_sum": sum(d[k][0] for d in docs), "tokens": sum(d[k][1] for d in docs),
                        "perplexity": math.exp(sum(d[k][0] for d in docs) / sum(d[k][1] for d in docs))}
                    for k in ("fresh", "repeat", "all")} for name, docs in rows.items()}
    print(f"{'result':32} {'fresh 1-9':>10} {'repeat 11-14':>13} {'all':>8}")
    for name, v in table.items():
        print(f"{name:32} {v['fresh']['perplexity']:10.3f} {v['repeat']['perplexity']:13.3f} {v['all']['perplexity']:8.3f}")
    controls = {}
    for name in rows:
        run, _, source = name.rpartition("-")
        if source != "bm25" or not run:
            continue
        for other in ("random", "none"):
            if f"{run}-{other}" in rows:
                r = _ratio([rows[f"{run}-{other}"]], [rows[name]], "repeat")
                controls[f"{run}: {other} / bm25"] = r
                print(f"{run}: repeats, {other} over BM25's neighbours {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] "
                      f"({len(rows[name])} documents resampled)")
    if against:
        for run in sorted({n.rpartition("-")[0] for n in rows} - {against}):
            names = [f"{r}-{src}" for r in (run, against) for src in ("random", "bm25")]
            if all(n in rows for n in names):
                a_r, a_b, b_r, b_b = (rows[n] for n in names)
                r = _ratio([a_r, b_b], [a_b, b_r], "repeat")  # (a_r / a_b) / (b_r / b_b), paired by document
                controls[f"{run} against {against}: (random / bm25) over (random / bm25)"] = r
                print(f"{run} against {against}: repeats, random over BM25's, the one over the other's {r['ratio']:.3f} "
                      f"[{r['low']:.3f}, {r['high']:.3f}]")
    if out:
        from rpt.utils import environment

        Path(out).write_text(json.dumps({"command": " ".join(sys.argv), "environment": environment(),
                                         "fresh_chunks": list(FRESH_CHUNKS),
                                         "repeat_chunks": list(REPEAT_CHUNKS), "results": table,
                                         "repeat_ratios": controls}, indent=1) + "\n")


def similarity(backbone: str, store: str, documents: int, segment_len: int, lower: int, upper: int) -> dict:
    """How alike a repeated token's states are to its source's, in the retrofit at initialisation (the backbone over
    the sliding window): the cosine between the state of a token in a repeat and the state of the same token at its
    source (the same 4 tokens ending there), against the state of the token 17 places further on, for the reading
    token's state in the lower decoder (after `lower` layers, where the neighbours' keys come from) and entering layer
    `upper` (the state a CCA of that layer makes its queries from), with the source's lower-decoder state."""
    import numpy as np
    import torch

    from rpt.config import RPTConfig
    from rpt.data.store import open_split
    from rpt.model.retrofit import RetrofitRPT
    from rpt.retrofit import backbone_fields

    fields = {k.removeprefix("model."): v for k, v in backbone_fields(backbone, lower, [upper]).items()}
    cfg = RPTConfig.from_preset("tiny", variant="retro", segment_len=segment_len, dropout=0.0, backbone_lower=lower,
                                **fields).model
    model = RetrofitRPT(cfg, seed=0).eval()
    states: dict[int, torch.Tensor] = {}
    for i in (lower - 1, upper - 1):
        model.layers[i].register_forward_hook(lambda m, a, out, i=i: states.__setitem__(i, out[0]))
    split = open_split(store, "test")
    sources = FRESH * PASSAGE  # the fresh passages, which the repeats copy
    first, end = REPEAT_CHUNKS[0] * cfg.chunk_size, (REPEAT_CHUNKS[-1] + 1) * cfg.chunk_size
    sums = {"lower": [[], []], "upper": [[], []]}
    for d in range(min(documents, len(split))):
        tokens = np.array(split.document(d), dtype=np.int64)
        pairs = []  # (repeated token, the same token at its source: the 4 tokens ending there match)
        for t in range(first, min(len(tokens), end)):
            j = next((j for j in range(3, sources) if (tokens[j - 3: j + 1] == tokens[t - 3: t + 1]).all()), None)
            if j is not None:
                pairs.append((t, j))
        with torch.no_grad():
            model(torch.as_tensor(tokens[None]), neighbor_ids=torch.full((1, len(tokens) // cfg.chunk_size, 1), -1))
        src = torch.nn.functional.normalize(states[lower - 1], dim=-1)
        for name, layer in (("lower", lower - 1), ("upper", upper - 1)):
            q = torch.nn.functional.normalize(states[layer], dim=-1)
            for t, j in pairs:
                sums[name][0].append(float(q[t] @ src[j]))
                sums[name][1].append(float(q[t] @ src[(j + 17) % sources]))
    out = {k: {"same_token": float(np.mean(v[0])), "other_token": float(np.mean(v[1])), "pairs": len(v[0])}
           for k, v in sums.items()}
    for k, v in out.items():
        print(f"reading token's state {'after layer ' + str(lower) if k == 'lower' else 'entering layer ' + str(upper)}: "
              f"cosine with its source's lower state {v['same_token']:.3f}, with another token's {v['other_token']:.3f} "
              f"({v['pairs']} repeated tokens)")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("corpus", help="write the far-copy corpus as JSONL")
    c.add_argument("--tokenizer", required=True, help="the backbone's tokenizer.json")
    c.add_argument("--out", required=True, help="the JSONL to write (must not exist)")
    c.add_argument("--train", type=int, default=400, help="training documents (default 400)")
    c.add_argument("--test", type=int, default=16, help="test documents (default 16)")
    c.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("summary", help="perplexity of fresh and repeated chunks per `rpt eval --per-chunk` result")
    s.add_argument("results", nargs="+")
    s.add_argument("--out", help="also write the table as JSON here")
    s.add_argument("--against", help="a run (results RUN-bm25.json, RUN-random.json): every other run's random-over-BM25 "
                                    "ratio on the repeats over this run's, paired by document")
    m = sub.add_parser("similarity", help="cosine of a repeated token's states with its source's, by layer")
    m.add_argument("--backbone", required=True)
    m.add_argument("--store", required=True, help="the corpus's token store (rpt prepare --tokenizer BACKBONE)")
    m.add_argument("--documents", type=int, default=4)
    m.add_argument("--segment-len", type=int, default=128)
    m.add_argument("--lower", type=int, default=15, help="model.backbone_lower (default 15)")
    m.add_argument("--upper", type=int, default=24, help="the CCA layer (default 24)")
    m.add_argument("--out", help="also write the result as JSON here")
    a = p.parse_args(argv)
    if a.verb == "similarity":
        got = similarity(a.backbone, a.store, a.documents, a.segment_len, a.lower, a.upper)
        if a.out:
            from rpt.utils import environment

            Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "environment": environment(), **got},
                                              indent=1) + "\n")
        return
    if a.verb == "corpus":
        if Path(a.out).exists():
            p.error(f"--out {a.out}: exists (choose a new file)")
        corpus(a.tokenizer, Path(a.out), a.train, a.test, a.seed)
    else:
        summary(a.results, a.out, a.against)


if __name__ == "__main__":
    main()
