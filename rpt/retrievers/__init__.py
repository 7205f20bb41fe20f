"""Retrievers that can stand in for BM25 or a model's own retriever at evaluation time (the Table 4 ablations).

- `rpt.retrievers.dpr`: the DPR-style dense retriever of App. C (`train_dpr`, `DPRRetriever.load`, `dpr_neighbors`).
"""
