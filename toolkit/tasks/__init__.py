"""Model families. Importing this package registers every task with toolkit.config.TASKS
(by module name: a task's module, and torch with it, is imported when a config names it)
and the families' label modes; generic code never imports it (binaries do).

Tasks of your own live in any importable module that registers them
(`@TASKS.register("name")` on a toolkit.task.Task subclass); list such modules in the
environment variable TOOLKIT_PLUGINS (comma-separated) and every binary imports them.
"""
import importlib
import os

from toolkit.config import TASKS
from toolkit.data.features import FEATURES
from toolkit.errors import UserError
from toolkit.tasks.kws import labels  # noqa: F401  (registers the "keyword" label mode)

for _name in ("codec", "kws", "speaker"):
    TASKS.register_lazy(_name, f"toolkit.tasks.{_name}.task")
# The keyword family's phone front end (CTC on espeak-ng phones).
TASKS.register_lazy("phone_ctc", "toolkit.tasks.kws.phones")
# Its frozen outputs as features of a wake-word head.
FEATURES.register_lazy("phone_frontend", "toolkit.tasks.kws.frontend")
# The worked example of the contract (docs/architecture.md walks it).
TASKS.register_lazy("example", "toolkit.tasks.example")


def _load_plugins() -> None:
    for name in filter(None, (n.strip() for n in os.environ.get("TOOLKIT_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise UserError(f"TOOLKIT_PLUGINS names module {name!r}, which cannot be imported: "
                            f"{err}") from None


_load_plugins()
