"""Development benchmarks of hvd-elastic, run from the checkout (not installed with the package):

- ``python -m benchmarks``: the policy x heterogeneity matrix, time to accuracy (benchmarks/matrix.py);
- ``python -m benchmarks.decisions``: costs of the native decision rules (``--quick`` for a smoke run);
- ``python benchmarks/scale.py``: model-size scale, step time / peak RSS / bytes per step vs plain Horovod.
"""
