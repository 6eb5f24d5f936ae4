"""Build hook for the compiled part of tsfront.

setuptools compiles the C files in ``native/`` into the one extension ``tsfront._native``
during ``pip install .``; everything else is declared in pyproject.toml. The headers ship in
the sdist through MANIFEST.in. ``TSFRONT_NATIVE_CFLAGS`` (space-separated) adds compile and
link flags, for the sanitizer build (scripts/sanitize).
"""

import os

from setuptools import Extension, setup

CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
SOURCES = [
    "msgpack.c",
    "frame.c",
    "region.c",
    "ridmap.c",
    "prefix.c",
    "writer.c",
    "reader.c",
    "subring.c",
    "sse.c",
    "push.c",
    "title.c",
    "encodecache.c",
    "lanes.c",
    "record.c",
    "turn.c",
    "module.c",
]
EXTRA = os.environ.get("TSFRONT_NATIVE_CFLAGS", "").split()

setup(
    ext_modules=[
        Extension(
            "tsfront._native",
            sources=[f"native/{name}" for name in SOURCES],
            depends=[f"native/{name}" for name in os.listdir("native") if name.endswith(".h")],
            extra_compile_args=[*CFLAGS, *EXTRA],
            extra_link_args=EXTRA,
        )
    ]
)
