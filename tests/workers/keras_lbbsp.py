"""Worker for tests/test_keras_lbbsp.py: Keras 3 model.fit under policy lbbsp (or bsp, the baseline); writes, per
rank, what the invariants need.

--mode check:    synthetic data of --samples samples whose first column is the sample's index (the model drops it),
                 hvd_elastic.keras.lbbsp_dataset for --epochs epochs; records every step's sizes (all ranks'),
                 this rank's indices per epoch as the train step saw them, and on rank 0 the largest difference
                 between the applied gradient ((w_before - w_after) / lr, plain SGD) and one process's gradient over
                 the global batch (the documented shared order) from the same weights (with --clipnorm C, that
                 gradient clipped to global norm C, the optimizer's global_clipnorm). Then checks that a
                 prefetching pipeline is refused.
--mode train:    scikit-learn digits for --steps steps (lbbsp: lbbsp_dataset; bsp: B / n random samples a rank);
                 records the sizes, the report and the accuracy. With --runs (a JSON list of the optimizer's
                 keywords, "steps" overriding --steps), one run after the other in one process:
                 rank<r>.<policy>.json.
--mode bad:      only build the optimizer (--frontend keras|tensorflow) and the dataset (bad-input tests;
                 TEST_DATASET_LEN sets the data size).
"""
import argparse
import hashlib
import os
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402

import hvd_elastic.keras as hvdk  # noqa: E402
from runs import each_run, write_outputs  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def flat(model):
    return np.concatenate([np.asarray(v.numpy()).ravel() for v in model.trainable_variables])


def sha(model):
    return hashlib.sha256(flat(model).astype(np.float32).tobytes()).hexdigest()


class Recorder(keras.callbacks.Callback):
    """Per step: the sizes decided for it, the indices the train step saw, and (rank 0) the gradient check."""

    def __init__(self, opt, seen, x, y, B, lr, seed, pad, clipnorm=0.0):
        super().__init__()
        self.opt, self.seen, self.x, self.y, self.B, self.lr, self.seed = opt, seen, x, y, B, lr, seed
        self.pad, self.clipnorm = pad, clipnorm
        self.steps, self.indices, self.grad_err, self.checked, self.clipped = [], [], 0.0, 0, 0
        self.epoch = 0
        self.step_in_epoch = 0
        # one process, plain Keras: the same layers without the index column
        self.reference = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="tanh"),
                                           keras.layers.Dense(3)])

        @tf.function(reduce_retracing=True)
        def ref_grad(xb, yb):
            with tf.GradientTape() as tape:
                loss = LOSS(yb, self.reference(xb, training=True))
            return tape.gradient(loss, self.reference.trainable_variables)

        self.ref_grad = ref_grad

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.step_in_epoch = epoch, 0
        self.indices.append([])

    def on_train_batch_begin(self, batch, logs=None):
        self.sizes = hvdk.batch_sizes(self.opt)
        self.before = flat(self.model)

    def on_train_batch_end(self, batch, logs=None):
        # SyncCallback (first in the list) has applied the global-batch gradient by now.
        idx = [int(i) for i in self.seen.numpy() if i >= 0]
        self.steps.append({"sizes": self.sizes, "local": len(idx)})
        self.indices[-1].extend(idx)
        if hvd.rank() == 0:
            order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.x))
            if self.pad and len(order) % self.B:   # drop_last=False: completed from the order's own start
                order = np.concatenate([order, order[:self.B - len(order) % self.B]])
            gb = order[self.step_in_epoch * self.B:(self.step_in_epoch + 1) * self.B]
            ref_vars = self.reference.trainable_variables
            for v, w in zip(ref_vars, unflatten(self.before, ref_vars)):
                v.assign(w)
            ref = np.concatenate([g.numpy().ravel() for g in self.ref_grad(self.x[gb][:, 1:], self.y[gb])])
            if self.clipnorm:     # the optimizer's global_clipnorm, applied to the global-batch gradient
                self.clipped += int(np.linalg.norm(ref) > self.clipnorm)
                ref = ref * min(1.0, self.clipnorm / float(np.linalg.norm(ref)))
            applied = (self.before - flat(self.model)) / self.lr
            self.grad_err = max(self.grad_err, float(np.abs(applied - ref).max()))
            self.checked += 1
        self.step_in_epoch += 1


def unflatten(vec, variables):
    out, off = [], 0
    for v in variables:
        n = int(np.prod(v.shape))
        out.append(vec[off:off + n].reshape(v.shape))
        off += n
    return out


def check(args):
    g = np.random.default_rng(3)
    n = args.samples
    x = np.concatenate([np.arange(n, dtype=np.float32)[:, None], g.standard_normal((n, 12)).astype(np.float32)], 1)
    y = g.integers(0, 3, n).astype(np.int64)
    B = int(os.environ["HVD_ELASTIC_GLOBAL_BATCH"])
    seen = tf.Variable(tf.fill([B], tf.constant(-1, tf.int64)), trainable=False)

    class Seq(keras.Sequential):
        def train_step(self, data):   # record the indices this step trains on (column 0), padded with -1
            idx = tf.cast(data[0][:, 0], tf.int64)
            seen.assign(tf.pad(idx, [[0, B - tf.shape(idx)[0]]], constant_values=-1))
            return super().train_step(data)

    keras.utils.set_random_seed(1 + hvd.rank())    # different on purpose: SyncCallback broadcasts rank 0's weights
    model = Seq([keras.Input((13,)), keras.layers.Lambda(lambda t: t[:, 1:]),
                 keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])
    lr = 0.1
    clip = {"global_clipnorm": args.clipnorm} if args.clipnorm else {}
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr, **clip))
    model.compile(optimizer=opt, loss=LOSS)
    seed = 11
    ds = hvdk.lbbsp_dataset(opt, (x, y), seed=seed, drop_last=not args.pad)
    rec = Recorder(opt, seen, x, y, B, lr, seed, args.pad, args.clipnorm)
    sync = hvdk.SyncCallback()
    model.fit(ds, epochs=args.epochs, verbose=0, callbacks=[sync, rec, hvdk.MetricAverageCallback()])
    # A pipeline that reads ahead of the steps (a prefetch) is refused: the size of a batch is decided after the
    # previous step.
    prefetch_error = ""
    opt2 = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr))
    it = iter(hvdk.lbbsp_dataset(opt2, (x, y)).prefetch(2))
    try:
        next(it)
        next(it)
    except Exception as e:  # noqa: BLE001  (tf.data wraps the generator's error)
        prefetch_error = str(e)
    return {"steps": rec.steps, "indices": rec.indices, "grad_err": rec.grad_err, "grad_checked": rec.checked,
            "clipped_steps": rec.clipped,
            "prefetch_error": prefetch_error, "weights_sha256": sha(model), "report": sync.report,
            "steps_per_epoch": int(ds.cardinality())}


def train(args, steps, **knobs):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), **knobs)
    model.compile(optimizer=opt, loss=LOSS)
    B = hvdk.settings(opt).global_batch or 64
    lbbsp = hvdk.settings(opt).spec.balances_batches
    sizes = []

    class Sizes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            sizes.append(hvdk.batch_sizes(opt) if lbbsp else [B // hvd.size()] * hvd.size())

    sync = hvdk.SyncCallback()
    if lbbsp:
        # One epoch of the data repeated (the bsp baseline below also runs one epoch).
        reps = -(-steps * B // len(x))
        ds = hvdk.lbbsp_dataset(opt, (np.tile(x, (reps, 1)), np.tile(y, reps)), seed=5)
        model.fit(ds.take(steps), epochs=1, verbose=0, callbacks=[sync, Sizes()])
    else:
        idx = np.random.default_rng(100 + hvd.rank()).integers(0, len(x), steps * (B // hvd.size()))
        model.fit(x[idx], y[idx], batch_size=B // hvd.size(), epochs=1, shuffle=False, verbose=0,
                  callbacks=[sync, Sizes()])
    acc = float((np.argmax(model.predict(x, verbose=0), 1) == y).mean())
    return {"sizes": sizes, "report": sync.report, "accuracy": acc, "weights_sha256": sha(model)}


def bad(args):
    n = int(os.environ.get("TEST_DATASET_LEN", "200"))
    if args.frontend == "tensorflow":
        import hvd_elastic.tensorflow as hvdtf
        hvdtf.DistributedOptimizer(keras.optimizers.SGD(0.1))
        return {}
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    if hvd.rank() == hvd.size() - 1:
        time.sleep(args.last_rank_late_s)
    hvdk.lbbsp_dataset(opt, (np.zeros((n, 4), np.float32), np.zeros(n, np.int64)))
    return {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--mode", choices=["check", "train", "bad"], required=True)
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--pad", action="store_true", help="drop_last=False")
    ap.add_argument("--clipnorm", type=float, default=0.0, help="--mode check: the SGD's global_clipnorm")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--frontend", choices=["keras", "tensorflow"], default="keras")
    ap.add_argument("--last-rank-late-s", type=float, default=0.0, help="--mode bad: the last rank reaches the "
                    "dataset this much later")
    ap.add_argument("--runs", default="", help="--mode train: a JSON list of runs (the optimizer's keywords)")
    args = ap.parse_args()
    hvd.init()
    if args.mode == "train" and args.runs:
        outs = {f"rank{hvd.rank()}.{policy}.json": train(args, steps, **knobs)
                for policy, steps, knobs in each_run(args.runs, "steps", args.steps)}
    else:
        run = {"check": check, "train": lambda a: train(a, a.steps), "bad": bad}[args.mode]
        outs = {f"rank{hvd.rank()}.json": run(args)}
    write_outputs(args.out_dir, hvd.rank(), outs)


if __name__ == "__main__":
    main()
