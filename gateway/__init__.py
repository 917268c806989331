"""The gateway: an OpenAI-compatible proxy in front of vLLM/SGLang fleets (gateway/app.py)."""

# the distribution's version (pyproject.toml), here at the bottom of the import graph so
# that the gateway does not import the command line above it (fleetgate/ re-exports it)
__version__ = "0.1.0"
