"""`fleetgate <command>`: a thin dispatcher.

Each command lives in its own package and exposes `main(argv) -> int`; they are imported
only when chosen, so `fleetgate serve` never loads the simulator and vice versa.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.cli", "run the gateway: fleetgate serve --config FILE"),
    "demo": ("fleetgate.demo", "an emulated fleet and the gateway in front of it, until Ctrl-C"),
    "emulate": ("emulator.cli", "an emulated vLLM or SGLang server"),
    "check-config": (
        "fleetgate.check_config",
        "validate gateway config files: the effective configuration or every problem",
    ),
    "simulate": ("simulator.cli", "run a simulation scenario"),
    "plan": ("fleetgate.plan", "size the cheapest two-pool fleet for a workload"),
    "train-predictor": (
        "fleetgate.predictor",
        "fit the QUARTZ prefill-time predictor from request logs",
    ),
}


def _usage() -> str:
    lines = ["usage: fleetgate <command> [options]", "", "commands:"]
    width = max(map(len, COMMANDS)) + 1
    lines += [f"  {name:<{width}} {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "fleetgate <command> --help for a command's options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from fleetgate import __version__

        print(f"fleetgate {__version__}")
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"fleetgate: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(args[1:])
    return result
