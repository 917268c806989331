"""fleetgate: the command line that ties the gateway, emulator, simulator and planner together."""

__version__ = "0.1.0"
