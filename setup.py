"""Only the optional C helpers (compressor/_fast.c, policies/assign/_greedy.c); everything
else is in pyproject.toml.

`optional=True`: without a compiler the install still succeeds and each runs its
numpy/Python path (compressor/compiled.py, policies/assign/compiled.py; the same results)."""

from setuptools import Extension, setup

# no fused multiply-adds: the compiled paths' floats must be numpy's, bit for bit
_FLAGS = ["-O2", "-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "compressor._fast",
            sources=["compressor/_fast.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
        Extension(
            "policies.assign._greedy",
            sources=["policies/assign/_greedy.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
    ]
)
