from apistack import api_stack  # noqa: F401  (fixture)
