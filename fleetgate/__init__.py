"""fleetgate: the command line that ties the gateway, emulator, simulator and planner together."""

from gateway import __version__

__all__ = ["__version__"]
