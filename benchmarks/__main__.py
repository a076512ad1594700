"""`python -m benchmarks`: see benchmarks/harness.py (kept there so tests can import it)."""

import sys

from benchmarks.harness import main

sys.exit(main())
