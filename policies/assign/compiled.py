"""The optional compiled greedy_swap (policies/assign/_greedy.c).

setup.py builds it with `optional=True`: a machine without a C compiler still installs
fleetgate and greedy_swap runs its numpy path, with the same decisions (the tests compare
the two decision for decision). `built` is the module when it was built (else None);
`fast` is what greedy_swap uses: `built`, unless FLEETGATE_PURE=1 asks for the numpy path,
as for the compressor (compressor/compiled.py).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    try:
        from policies.assign import _greedy  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _greedy  # type: ignore[no-any-return]


built = _load()
fast = None if os.environ.get("FLEETGATE_PURE", "") not in ("", "0") else built
