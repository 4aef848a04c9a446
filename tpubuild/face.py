"""A package's face: the names the rest of tpubuild may import from it, each loaded from
its own module on first use (PEP 562 module `__getattr__`), so that importing one part of
a package loads no other part and a stage's code digest (keys/code.py, which reads each
package's literal `_FACE`) covers only the modules a stage really imports."""

from __future__ import annotations

from typing import Any, Callable


def lazy(package: str, face: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose `face` maps each name to the
    module of the package that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in face:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # __import__, the import statement's own path (-X importtime sees it), not importlib's.
        return getattr(__import__(f"{package}.{face[name]}", fromlist=[name]), name)

    def __dir__() -> list[str]:
        return sorted(face)

    return __getattr__, __dir__
