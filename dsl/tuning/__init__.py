"""Auto-tuning: the search (:mod:`~dsl.tuning.tune`, ``dsl.tune``), its meta-schedule glue
(:mod:`~dsl.tuning.meta_schedule`: database adapter, design space, builder and runner) and the
per-user tuning database (:mod:`~dsl.tuning.database`). The command line is
:mod:`dsl.cli.tune`.

Importing this package plugs the database into :func:`dsl.auto_schedule` and ``build`` (the
runtime sits below this layer and never imports it).
"""

from dsl.runtime.schedule import TUNING_HOOKS as _HOOKS
from dsl.tuning import database as _database

_HOOKS.apply = _database.apply_tuned
_HOOKS.reject = _database.reject
