"""python -m tests.golden: print the golden list of the gateway's metrics, built in-process."""

from tests.golden import format_catalogue, in_process_exposition, parse_exposition

print(format_catalogue(parse_exposition(in_process_exposition())), end="")
