"""QUARTZ: quantile prediction of prefill time from router-visible features
(the QUARTZ paper). `features.py` is the contract between its parts."""
