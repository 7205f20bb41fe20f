"""What each experiment writes into its output folder (rpt.outputs' policy: a folder holding anything else is refused
before any work): trees of token stores, runs and results of their own."""

from __future__ import annotations

from rpt.outputs import Owner

SWEEP = Owner("sweep", ("*-seed*", "eval", "curve", "curve.json", "curve.md", "compare.json", "compare.md", "commands.txt",
                        ".*.tmp", ".*.lock"),
              lambda f: (f / "commands.txt").is_file() or any(r.is_dir() for r in f.glob("*-seed*")))
COPYTEST = Owner("copytest", ("stores", "runs", "copytest*.json", ".*.tmp", ".*.lock"),
                 lambda f: (f / "stores").is_dir() or (f / "runs").is_dir())
DEMO = Owner("demo", ("copy", "results", ".*.tmp", ".*.lock"), lambda f: (f / "copy").is_dir())
