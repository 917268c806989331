"""QUARTZ: quantile prediction of prefill time from router-visible features
(../shared/seeds/003). `features.py` is the contract between its parts."""
