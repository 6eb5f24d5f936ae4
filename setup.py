"""Build hook for the compiled part of tsfront.

setuptools compiles ``native/tsfront_native.c`` into ``tsfront._native`` during
``pip install .``; everything else is declared in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tsfront._native",
            sources=["native/tsfront_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
