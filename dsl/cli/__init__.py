"""The ``python -m dsl`` commands (registered in ``dsl/__main__.py``'s ``COMMANDS``): examples,
bench (benchmark suites), tune, show, clean; and what they share: :mod:`~dsl.cli.common`
(program name, usage errors, ``--suite`` / ``--filter``) and :mod:`~dsl.cli.output` (tables,
``--json``)."""
