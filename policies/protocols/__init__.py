"""The contracts of the pipeline core's extension points, in one place.

Each module here holds one extension point's protocol, the types its policies answer
with, and its `Registry` (policies/registry.py). Nothing here imports a policy: the
built-in policies sit beside their step and import their protocol from here, and each
step's own module imports its built-ins by an explicit list, so registration never loops
back (import-linter's `acyclic_siblings` contract in pyproject.toml keeps it so).

    extension point   protocol (here)            built-ins registered by   policies
    admission         admission.Admitter         policies/admission.py     always, concurrency,
                                                                           token_pools (tenancy/)
    dispatch          dispatch.Dispatcher        policies/queue/__init__   fifo, quartz, token_fair
    routing           routing.Router             policies/routing/__init__ least_loaded, locality,
                                                                           power_of_two, quartz,
                                                                           round_robin
    placement         placement.Placer           policies/pools.py         short_long,
                                                                           compress_and_route
    pair selection    pairs.PairSelector         policies/pd/__init__      kv_cost_decode_load,
    (`pd` pools)                                                           round_robin, random

Build a policy by name through its step's module (`make_admitter`, `make_dispatcher`,
`make_router`, `make_placer`, `make_pair_selector`): importing that module is what fills the registry.
"""
