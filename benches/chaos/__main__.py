"""``python benches/chaos ...``: one chaos run (see the package's docstring)."""

import sys
from pathlib import Path

# Run as ``python benches/chaos``, Python puts this directory on sys.path: its parent instead, so
# that the modules are imported once, as the package ``chaos``.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from chaos.run import main  # noqa: E402

sys.exit(main())
