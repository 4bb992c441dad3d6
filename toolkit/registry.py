"""Name -> class registries, so configs select components without if/elif chains."""
from typing import Callable, Dict, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: Dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj
        return wrap

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} '{name}'; known: {known}") from None

    def names(self):
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
