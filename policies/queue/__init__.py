"""Ordered admission queues behind the `Dispatcher` protocol (policies/dispatch.py):
`quartz` (predicted tail prefill, aging, client fairness) and `token_fair` (least recent
client service first), sharing per-client service counters (counters.py)."""
