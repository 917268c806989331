"""The optional compiled greedy_swap (policies/assign/_greedy.c), or None.

setup.py builds it with `optional=True`: a machine without a C compiler still installs
fleetgate and greedy_swap runs its numpy path, with the same decisions (the tests compare
the two decision for decision). FLEETGATE_PURE=1 forces that path, as for the compressor
(compressor/compiled.py).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("FLEETGATE_PURE", "") not in ("", "0"):
        return None
    try:
        from policies.assign import _greedy  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _greedy  # type: ignore[no-any-return]


fast = _load()
