"""``tsfront serve`` as a real process group for the serve tests: the library's rig.

`ServeProcess` and `serve_children` are `tsfront.testing.serve`'s (the pytest plugin's
``tsfront_serve`` fixture is built on them): the command in its own session, its stdout lines
waited for with a deadline, SIGTERM then SIGKILL of whatever is left of the session.
"""

from __future__ import annotations

from tsfront.testing.serve import ServeProcess, serve_children, start_served

__all__ = ["ServeProcess", "serve_children", "start_served"]
