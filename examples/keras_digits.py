"""Train a small MLP on scikit-learn's digits with Keras 3 model.fit under hvd-elastic (policy: HVD_ELASTIC_POLICY).

Launch (2 ranks; rank 1 an emulated straggler):

    HVD_ELASTIC_POLICY=zipline HVD_ELASTIC_EMULATE_DELAY='*:0.002,1:0.02' \
        horovodrun -np 2 -H localhost:2 --gloo python examples/keras_digits.py
    HVD_ELASTIC_POLICY=asp mpirun -np 2 python examples/keras_digits.py

LB-BSP (the global batch B = 4 x 16 re-split every step; rank 3 three times slower per sample):

    HVD_ELASTIC_POLICY=lbbsp HVD_ELASTIC_GLOBAL_BATCH=64 HVD_ELASTIC_EMULATE_SAMPLE_DELAY='*:0.001,3:0.003' \
        mpirun -np 4 python examples/keras_digits.py

Prints the test accuracy and (rank 0) each rank's compute / wait / communication time.
"""
import argparse
import os

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)   # several ranks per machine: one thread each
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvd_elastic.keras as hvde  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8, help="epochs of the whole training set, all ranks together")
    ap.add_argument("--batch-size", type=int, default=16, help="per-rank batch size (lbbsp: the mean share of B)")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate before scaling by the number of ranks")
    ap.add_argument("--momentum", type=float, default=0.5)
    args = ap.parse_args()

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())       # different on purpose: SyncCallback broadcasts rank 0's weights
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lbbsp = os.environ.get("HVD_ELASTIC_POLICY", "bsp").lower() == "lbbsp"
    steps_per_epoch = len(x_tr) // (args.batch_size * hvd.size())
    lr = hvde.WarmupSchedule(hvde.scale_lr(args.lr), warmup_steps=steps_per_epoch)
    opt = hvde.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=args.momentum),
                                    **({"global_batch": args.batch_size * hvd.size()} if lbbsp else {}))
    model.compile(optimizer=opt, loss=loss, metrics=["accuracy"])

    if lbbsp:
        # Every rank reads the whole training set: each step's global batch (B samples of one shared shuffled
        # order) is split by the policy, slow ranks taking fewer samples.
        sync = hvde.SyncCallback()
        hist = model.fit(hvde.lbbsp_dataset(opt, (x_tr, y_tr), seed=0), epochs=args.epochs, verbose=0,
                         callbacks=[sync, hvde.MetricAverageCallback()])
        extra = f" batch sizes {hvde.batch_sizes(opt)}"
    else:
        # This rank's shard, and a budget of global steps (all ranks together): under bsp every rank takes the
        # same share; under the relaxed policies fast ranks take more. The shard is repeated so that a fast rank
        # never runs out of batches.
        x_tr, y_tr = x_tr[hvd.rank()::hvd.size()], y_tr[hvd.rank()::hvd.size()]
        total = args.epochs * steps_per_epoch * hvd.size()
        order = np.random.default_rng(1000 + hvd.rank()).permutation(np.tile(np.arange(len(x_tr)), total))
        xs, ys = x_tr[order[:total * args.batch_size]], y_tr[order[:total * args.batch_size]]
        sync = hvde.SyncCallback(global_steps=total)
        hist = model.fit(xs, ys, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0,
                         callbacks=[sync, hvde.MetricAverageCallback()])
        extra = ""
    # Here every rank holds the same weights; rank 0 has printed the report (also in sync.report).
    acc = float((np.argmax(model.predict(x_te, verbose=0), 1) == y_te).mean())
    if hvd.rank() == 0:
        print(f"keras_digits: policy={sync.report['policy']} ranks={hvd.size()} "
              f"train loss (mean over ranks)={hist.history['loss'][-1]:.3f} test accuracy={acc:.3f}{extra}",
              flush=True)


if __name__ == "__main__":
    main()
