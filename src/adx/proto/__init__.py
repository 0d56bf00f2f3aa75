"""Protocol definitions (.proto) and their generated stubs (``scripts/gen_proto.py`` regenerates them)."""
