"""Only the optional C helper (compressor/_fast.c); everything else is in pyproject.toml.

`optional=True`: without a compiler the install still succeeds and the compressor runs its
numpy/Python path (compressor/compiled.py; the same results)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "compressor._fast",
            sources=["compressor/_fast.c"],
            # no fused multiply-adds: scoring.py's floats must be numpy's, bit for bit
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
