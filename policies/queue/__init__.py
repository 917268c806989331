"""The built-in dispatchers behind the `Dispatcher` protocol (policies/protocols/dispatch.py),
one per file: `fifo` (first come first served), `quartz` (predicted tail prefill, aging,
client fairness) and `token_fair` (least recent client service first). They share the
waiter bookkeeping (waiters.py) and per-client service counters (counters.py).

The list below is the one place that registers them: importing anything under
policies.queue fills `DISPATCHERS`.
"""

from policies.queue import fifo, quartz, token_fair  # noqa: F401  (each registers itself)
