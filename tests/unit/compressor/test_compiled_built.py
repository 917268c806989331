"""The compiled helper is optional for an install, not for CI: where `make test` ran with a
C compiler, compressor._fast must have been built, or every test of it (test_fast.py, which
skips without it) would pass by skipping and the gateway would run the slower path."""

from __future__ import annotations

import os
import shutil

import pytest

from compressor import compiled


@pytest.mark.skipif(
    not os.environ.get("CI") or shutil.which("cc") is None,
    reason="only CI insists: it installs with a C compiler",
)
@pytest.mark.skipif(
    os.environ.get("FLEETGATE_PURE", "") not in ("", "0"), reason="the pure path was asked for"
)
def test_ci_built_the_compiled_helper():
    assert compiled.fast is not None, "compressor/_fast.c was not built (setup.py, optional)"
