"""One Keras benchmark job (a rank of it): the torch worker's MLP and data under Keras 3 ``model.fit``, policy from
HVD_ELASTIC_POLICY (bsp is the reference here: Horovod's own Keras layer does not work with Keras 3). Launched by
``python -m benchmarks``; not a user API. Same emulation and outputs as benchmarks/torch_worker.py.
"""
import json
import os
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402

import hvd_elastic.keras as hvdk  # noqa: E402
from hvd_elastic import registry  # noqa: E402
from hvd_elastic.tensorflow._core import state_of  # noqa: E402
from benchmarks.matrix import worker_arguments, worker_straggler  # noqa: E402


class Bench(keras.callbacks.Callback):
    """Emulated slowness after each batch (listed before SyncCallback: the sleep is part of the step it hands on)
    and rank 0's accuracy curve."""

    def __init__(self, straggler, opt, lbbsp, batch, every, x_te, y_te, t0):
        super().__init__()
        self.straggler, self.opt, self.lbbsp, self.batch, self.every = straggler, opt, lbbsp, batch, every
        self.x_te, self.y_te, self.t0 = x_te, y_te, t0
        self.curve, self.local = [], 0

    def on_train_batch_begin(self, batch, logs=None):
        self.samples = hvdk.batch_sizes(self.opt)[hvd.rank()] if self.lbbsp else self.batch

    def on_train_batch_end(self, batch, logs=None):
        self.straggler.pause(0.0, samples=self.samples)
        self.local += 1

    def accuracy(self) -> float:
        return float((np.argmax(self.model(self.x_te, training=False).numpy(), 1) == self.y_te).mean())

    def evaluate(self, global_steps):
        acc = self.accuracy()
        self.curve.append([time.perf_counter() - self.t0[0], global_steps, acc])
        return acc


class Curve(keras.callbacks.Callback):
    """After SyncCallback: rank 0 evaluates every `every` local steps."""

    def __init__(self, bench, opt):
        super().__init__()
        self.bench, self.opt = bench, opt

    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == 0 and self.bench.local % self.bench.every == 0:
            self.bench.evaluate(hvdk.global_steps(self.opt))


def main():
    args = worker_arguments(__doc__.splitlines()[0]).parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed)
    data = np.load(args.data)
    x_tr, y_tr, x_te, y_te = (data[k] for k in ("x_tr", "y_tr", "x_te", "y_te"))
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    lbbsp = registry.policy(os.environ.get("HVD_ELASTIC_POLICY", registry.DEFAULT)).balances_batches
    B = args.batch_size * size
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(args.lr * size, momentum=args.momentum),
                                    **({"global_batch": B} if lbbsp else {}))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    straggler = worker_straggler(args, rank, size)
    t0 = [0.0]
    bench = Bench(straggler, opt, lbbsp, args.batch_size, args.eval_every, x_te, y_te, t0)

    class Start(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):   # after SyncCallback's broadcast: start the clock together
            if rank == 0:   # the curve starts at the initial accuracy, taken before the clock starts
                bench.curve.append([0.0, 0, bench.accuracy()])
            hvd.allreduce(tf.zeros(1), name="bench.start")
            t0[0] = time.perf_counter()
            # the report measures from here (set-up is not training time), as in torch_worker.py
            session = state_of(opt).session
            session.telemetry.restart(t0[0])
            session.last_step_end = t0[0]

    local_steps = args.global_steps // size
    if lbbsp:
        reps = -(-local_steps * B // len(x_tr))          # one pass over the repeated data: no epoch boundaries
        data = hvdk.lbbsp_dataset(opt, (np.tile(x_tr, (reps, 1)), np.tile(y_tr, reps)), seed=args.seed)
        sync = hvdk.SyncCallback()
        fit_args = dict(x=data.take(local_steps))
    else:
        # this rank's shard, repeated; a budget of global steps (fast ranks take more under the relaxed policies)
        xs, ys = x_tr[rank::size], y_tr[rank::size]
        rng = np.random.default_rng(1000 * (args.seed + 1) + rank)
        order = rng.permutation(np.tile(np.arange(len(xs)), args.global_steps))
        order = order[:args.global_steps * args.batch_size]
        sync = hvdk.SyncCallback(global_steps=args.global_steps)
        fit_args = dict(x=xs[order], y=ys[order], batch_size=args.batch_size, shuffle=False)
    model.fit(**fit_args, epochs=1, verbose=0, callbacks=[bench, sync, Start(), Curve(bench, opt)])
    wall = time.perf_counter() - t0[0]
    final = bench.accuracy()
    if rank == 0:
        # the job's real gradient count after the final synchronization: a relaxed rank checks the budget against
        # its own view of the others, so each of them may take one step past it
        curve = bench.curve + [[wall, hvdk.global_steps(opt), final]]
        with open(args.out, "w") as f:
            json.dump({"policy": sync.report["policy"], "wall_s": wall, "final_accuracy": final, "curve": curve,
                       "report": sync.report, "local_steps": bench.local}, f)


if __name__ == "__main__":
    main()
