"""Auto-tuning: meta-schedule search (:mod:`~dsl.tuning.tune`) and the per-user tuning
database (:mod:`~dsl.tuning.database`).

Importing this package plugs the database into :func:`dsl.auto_schedule` and ``build`` (the
runtime sits below this layer and never imports it).
"""

from dsl.runtime.schedule import TUNING_HOOKS as _HOOKS
from dsl.tuning import database as _database

_HOOKS.apply = _database.apply_tuned
_HOOKS.reject = _database.reject
