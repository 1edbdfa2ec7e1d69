"""``python -m benchmarks``: the policy x heterogeneity benchmark matrix (benchmarks/matrix.py).
``python -m benchmarks.decisions`` times the native decision rules."""
import sys

from .matrix import main

sys.exit(main())
