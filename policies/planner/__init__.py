"""FleetOpt: the analytical two-pool fleet planner (FleetOpt §3–4, §6–7, Appendix A).

Given a workload's L_total CDF, an arrival rate λ and a P99 TTFT target, return the
minimum-cost (n_s, n_l, B_short, γ) and the baselines of the paper's Table 3. Each pool is
an M/G/c queue with c = n·n_max KV slots; service times come from the iteration model;
Erlang-C is evaluated in log space; the Kimura P99 wait and the ρ_max cap size each pool;
Algorithm 1 sweeps (B_short, γ) with the long pool recalibrated on the post-compression
distribution.

Modules, one idea each:
- `profile`  — hardware/model profiles as data, the built-in A100-80GB / Llama-3-70B;
- `workload` — the CDF, interpolation, restriction to a pool;
- `service`  — the iteration model, per-pool moments (Monte Carlo or exact);
- `erlang`   — Erlang-C (log space), Kimura, the GPU count of Eq. 11;
- `options`  — every modelling choice the paper leaves open;
- `grid`     — per-cell moment arrays and their mixing (C&R populations);
- `sweep`    — Algorithm 1: calibrate once, sweep in microseconds;
- `fleet`    — the optimum and the baselines as rows; pricing a given fleet;
- `live`     — the gateway's observed histogram and the live plan;
- `report`   — table, explanation and JSON rendering;
- `paper`    — the paper's published Tables 3, 5 and 6 as data.

Pure: no I/O, no clock. The CLI (`fleetgate plan`) reads files and fetches histograms.
"""

from policies.planner.erlang import Binding, erlang_c, kimura_p99_wait, log_erlang_c, size_pool
from policies.planner.fleet import FleetRow, Plan, PoolReport, evaluate, plan, plan_from_sweep
from policies.planner.live import ObservedTraffic, live_plan, parse_histogram
from policies.planner.options import DEFAULT, EXACT, GAMMAS, PAPER, PlannerOptions
from policies.planner.profile import A100_LLAMA3_70B, BUILTIN_PROFILES, HardwareProfile
from policies.planner.sweep import Calibration, FleetSpec, Sweep, calibrate, sweep
from policies.planner.workload import LengthCdf

__all__ = [
    "A100_LLAMA3_70B",
    "BUILTIN_PROFILES",
    "DEFAULT",
    "EXACT",
    "GAMMAS",
    "PAPER",
    "Binding",
    "Calibration",
    "FleetRow",
    "FleetSpec",
    "HardwareProfile",
    "LengthCdf",
    "ObservedTraffic",
    "Plan",
    "PlannerOptions",
    "PoolReport",
    "Sweep",
    "calibrate",
    "erlang_c",
    "evaluate",
    "kimura_p99_wait",
    "live_plan",
    "log_erlang_c",
    "parse_histogram",
    "plan",
    "plan_from_sweep",
    "size_pool",
    "sweep",
]
