"""Training: the loop, losses, schedules, optimisers, data, distributed helpers and the step-memory estimate (the
Python API's `rpt.train` runs `rpt.training.loop.train`)."""
