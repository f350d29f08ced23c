"""Build step for the one native piece: models/_native.c, the mixture's fused gradient kernel.

Everything else is declared in pyproject.toml. The extension is optional: without a C compiler
the install still succeeds and models/native.py falls back to the numpy/torch path (tests
report which path ran; `cusp bench` records it).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "models._native",
            sources=["models/_native.c"],
            # -O3 for the vectoriser; no -ffast-math: the exp's rounding trick and the fixed
            # summation order need IEEE semantics (and gcc < 13 would set FTZ/DAZ process-wide)
            extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi"],
            optional=True,
        )
    ]
)
