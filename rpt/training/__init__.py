"""Training (the loop, losses, schedules, data). Called as a function, ``rpt.train(config, store, out, **overrides)``,
this package runs `rpt.api.train`."""

from rpt.utils import callable_module

callable_module(__name__, "rpt.api.train")
