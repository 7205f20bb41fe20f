"""The experiments: drivers that run the library end to end to produce the documented figures, kept apart from the
library itself (model, data, labels, train, eval, generate). Each backs an `rpt` verb in rpt/commands/.

    demo.py          `rpt demo`: the copy test at a small size, xl against rpt-sem: retrieval shown working
    sweep.py         `rpt sweep`: variants x paired seeds on one store, trained, evaluated and tabulated
    compare.py       `rpt compare`: `rpt eval` results as the paper's tables, over seeds
    copytest.py      `rpt copytest`: near and far repeats, the proof that retrieval is used
    bench.py         `rpt bench`: step time, memory and evaluation cost, side by side
    bench_labels.py  the labelling throughput part of `rpt bench` (benchmarks/bench_labels.py runs it alone)
    kernels.py       `rpt bench --kernels`: which attention kernel each call site runs
"""
