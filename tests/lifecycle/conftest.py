import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))

from apistack import api_for, api_stack  # noqa: F401  (fixtures)
