"""Name -> class registries, so configs select components without if/elif chains."""
import importlib
from typing import Callable, Dict, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: Dict[str, T] = {}
        self._lazy: Dict[str, str] = {}     # name -> module that registers it when imported

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            self._lazy.pop(name, None)
            return obj
        return wrap

    def register_lazy(self, name: str, module: str) -> None:
        """`name` is registered by importing `module`, done on the first get(): a binary
        that only lists or checks names (and never builds one) skips that import."""
        if name in self._items or name in self._lazy:
            raise KeyError(f"{self.kind} '{name}' registered twice")
        self._lazy[name] = module

    def get(self, name: str) -> T:
        if name not in self._items and name in self._lazy:
            module = self._lazy[name]
            importlib.import_module(module)
            if name not in self._items:
                raise KeyError(f"{self.kind} '{name}': importing {module} did not register it")
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} '{name}'; known: "
                           f"{', '.join(self.names()) or '(none)'}") from None

    def names(self):
        return sorted(set(self._items) | set(self._lazy))

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._lazy
