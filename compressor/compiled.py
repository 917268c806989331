"""The optional compiled helper (compressor/_fast.c), or None.

setup.py builds it with `optional=True`: a machine without a C compiler still installs
fleetgate and the compressor runs its numpy/Python path, with the same results (the tests
compare the two value for value). FLEETGATE_PURE=1 forces that path (the tests and
bench/compressor_identity.py run both).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("FLEETGATE_PURE", "") not in ("", "0"):
        return None
    try:
        from compressor import _fast  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _fast  # type: ignore[no-any-return]


fast = _load()
