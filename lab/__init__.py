"""The experiments: drivers that run the library end to end to produce and check the documented figures. They live
beside the library, not in it: `pip install` installs rpt alone, and a checkout of the repository runs these as
`python -m lab <verb>` (lab/cli.py; one module per verb in lab/commands/).

    demo.py          `python -m lab demo`: the copy test at a small size, xl against rpt-sem: retrieval shown working
    sweep.py         `python -m lab sweep`: variants x paired seeds on one store, trained, evaluated and tabulated
    compare.py       `python -m lab compare`: `rpt eval` results as the paper's tables, over seeds
    copytest.py      `python -m lab copytest`: near and far repeats, the proof that retrieval is used
    bench.py         `python -m lab bench`: step time, memory and evaluation cost, side by side
    bench_labels.py  the labelling throughput part of `python -m lab bench` (benchmarks/bench_labels.py runs it alone)
    kernels.py       `python -m lab bench --kernels`: which attention kernel each call site runs
"""
