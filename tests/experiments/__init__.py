"""The experiment harnesses the tests check and the benchmarks print: the QUARTZ protocol
(quartz_protocol.py, quartz_oracle.py, quartz_experiments.py), the token-pools paper's
experiments (token_pools_experiments.py) and their live runs through real gateway and
emulator processes (quartz_live.py, token_pools_live.py). bench/ holds their command
lines; nothing under tests/ imports bench/."""
