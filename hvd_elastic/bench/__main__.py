"""``python -m hvd_elastic.bench``: the policy x heterogeneity benchmark matrix (hvd_elastic/bench/matrix.py).
``python -m hvd_elastic.bench.decisions`` times the native decision rules."""
import sys

from .matrix import main

sys.exit(main())
