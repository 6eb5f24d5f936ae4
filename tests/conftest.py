"""Root of tsfront's test suite.

Layout: ``tests/support/`` holds the shared rigs (a package, imported as
``support.core_fixtures`` and so on; this file's folder is on ``sys.path`` through pytest's
rootdir-relative import mode); ``tests/interop/`` runs against TokenSpeed's own engine code
(its own conftest and harness); ``tests/fuzz/`` holds the atheris targets; ``tests/data/``
the golden vectors. The fixtures of tsfront's pytest plugin (``tsfront_engines``,
``tsfront_replay``, ``tsfront_serve``, ``tsfront_sim``, ``tsfront_model``;
``tsfront.testing.plugin``, loaded through its ``pytest11`` entry point) are the same ones a
user's suite gets from ``tsfront[testing]``; this file checks they are there, so a venv
without the plugin fails at once rather than test by test.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("tsfront"):
        raise pytest.UsageError(
            "tsfront's pytest plugin is not loaded: install tsfront with its test extra "
            "(pip install -e '.[test,bench]') and do not pass -p no:tsfront"
        )
