from apistack import api_for, api_stack  # noqa: F401  (fixtures)
