"""The ``python -m dsl`` commands: examples (the main job), bench (benchmark suites), tune."""
