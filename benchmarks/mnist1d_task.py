"""The benchmark's MNIST-1D task (``python -m benchmarks --task mnist1d``): data and model.

MNIST-1D (Greydanus, 2020) is generated here with the ``mnist1d`` package, never downloaded: ten 1-D templates of
length 12, padded, scaled, shifted, sheared and noised into sequences of 40 values. 10000 samples (the package's
default is 5000) split 8000 / 2000, with the package's default arguments and seed 42, so every job and every run of
the matrix sees the same data. The driver writes the arrays once to an .npz (:func:`write_data`); the ranks only
load it (importing mnist1d pulls matplotlib: seconds per rank on a loaded 2-core machine).

The model (:func:`torch_model`) is a small 1-D CNN, 9610 parameters. The benchmark trains it with SGD at lr 0.15
(per-rank 0.0375 x 4 ranks), momentum 0.5, 4 x 32 samples per synchronous step: plain Horovod reaches 0.90 test
accuracy after about 2900-3000 gradients of 32 samples (4 ranks, seeds 0 and 2) and ends near 0.95 after 5000: a
task that needs thousands of gradients, with headroom above the 0.90 target. lr 0.2 (0.05 x 4) is at the edge of
stability for this model: synchronous runs (Horovod, lbbsp: the same global-batch gradient) may then end barely
above the target or collapse to chance, which is why the benchmark stays below it.
"""
from __future__ import annotations

NUM_SAMPLES = 10000        # 8000 train / 2000 test
LENGTH = 40                # mnist1d's final_seq_length (its default)
WIDTH = 32                 # channels of the CNN


def write_data(path: str, num_samples: int = NUM_SAMPLES):
    """Generate MNIST-1D locally (mnist1d.data.make_dataset, the package's default arguments and seed except
    num_samples) and save x_tr, y_tr, x_te, y_te (float32 / int64) to `path` for the ranks."""
    import numpy as np
    from mnist1d.data import get_dataset_args, make_dataset   # make_dataset generates; get_dataset would download
    args = get_dataset_args()
    args.num_samples = num_samples
    state = np.random.get_state()       # make_dataset seeds numpy's global generator (args.seed): leave it as it was
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(state)
    np.savez(path, x_tr=d["x"].astype(np.float32), y_tr=d["y"].astype(np.int64),
             x_te=d["x_test"].astype(np.float32), y_te=d["y_test"].astype(np.int64))


def torch_model(width: int = WIDTH):
    """Conv1d 1->w k5 pad 2, ReLU, Conv1d w->w k3 stride 2, ReLU, Conv1d w->w k3 stride 2, ReLU, Linear 10w->10;
    takes a batch of sequences (N, 40)."""
    import torch.nn as nn
    return nn.Sequential(nn.Unflatten(1, (1, LENGTH)),
                         nn.Conv1d(1, width, 5, padding=2), nn.ReLU(),
                         nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),     # 40 -> 20
                         nn.Conv1d(width, width, 3, stride=2, padding=1), nn.ReLU(),     # 20 -> 10
                         nn.Flatten(), nn.Linear(width * LENGTH // 4, 10))
