"""Import stubs for the GPU-only modules TokenSpeed's wire code imports.

Owns one thing: a meta-path finder, appended *last* to ``sys.meta_path`` (so a
real installation always wins), that answers imports of a fixed set of
GPU-only top-level packages (``torch``, ``tokenspeed_kernel``, ...) with stub
modules. Every attribute of a stub module is a stub class, so the engine's
module-level code (type annotations, ``isinstance`` checks, decorators,
feature probes such as ``torch.cuda.is_available()``) runs harmlessly while
the pure-Python wire code (msgspec structs, pyzmq sockets) runs for real.

This is tsfront's own code: it carries no engine source. The interop venv
activates it via a ``.pth`` file written by ``scripts/interop-venv``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

#: Top-level packages that only exist on GPU machines (or are native builds).
STUBBED_ROOTS: frozenset[str] = frozenset(
    {
        "torch",
        "torchvision",
        "tokenspeed_kernel",
        "tokenspeed_triton",
        "tokenspeed_scheduler",
        "tokenspeed_mooncake",
        "transformers",
        "triton",
    }
)


class _StubMeta(type):
    """Metaclass that makes stub *classes* absorb any use.

    Stub attributes are classes (not instances) so that ``isinstance(x,
    torch.Tensor)`` and ``issubclass(ty, torch.Tensor)`` work, and engine
    classes can inherit from them (``class M(torch.nn.Module)``).
    """

    def __getattr__(cls, name: str) -> Any:
        # Dunder lookups must fail: msgspec, dataclasses, typing and pickle
        # probe for __dataclass_fields__, __origin__, ... and would otherwise
        # mistake a stub for a dataclass or a generic alias.
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_stub(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # Used as a bare decorator (@torch.compile, @triton.jit): hand the
        # function back untouched so it still works if it is ever called.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        # Used as a decorator factory (@torch.compile(dynamic=True)).
        if not args and kwargs:
            return _passthrough
        return super().__call__()

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __bool__(cls) -> bool:
        return True

    def __or__(cls, other: Any) -> Any:
        # ``torch.Tensor | None`` in evaluated annotations.
        return Any

    __ror__ = __or__


class _StubBase(metaclass=_StubMeta):
    """Instances (results of calling a stub) are falsy, empty and inert."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_stub(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _StubBase()

    def __bool__(self) -> bool:
        # Feature probes (is_available(), pdl_enabled()) read as "off".
        return False

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0


def _passthrough(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator that returns its argument unchanged."""
    return fn


def _make_stub(qualname: str) -> type:
    """Return a fresh stub class named ``qualname``."""
    name = qualname.rsplit(".", 1)[-1]
    return _StubMeta(name, (_StubBase,), {"__qualname__": qualname, "__module__": "stub"})


class _StubModule(types.ModuleType):
    """A module whose every missing attribute is a stub class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _make_stub(f"{self.__name__}.{name}")
        # Cache so repeated lookups give the same class (identity checks).
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    """Creates :class:`_StubModule` instances; executing them is a no-op."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so any submodule import also resolves here
        module.__version__ = "0.0.0+tsfront.stub"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class StubFinder(importlib.abc.MetaPathFinder):
    """Finds stub modules for :data:`STUBBED_ROOTS` and their submodules."""

    def __init__(self, roots: frozenset[str] = STUBBED_ROOTS) -> None:
        self._roots = roots
        self._loader = _StubLoader()

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        """Return a stub spec when ``fullname`` lies under a stubbed root."""
        if fullname.split(".", 1)[0] not in self._roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)


def install() -> None:
    """Append the stub finder to ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.append(StubFinder())
