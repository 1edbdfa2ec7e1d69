"""A Horovod elastic job (horovodrun --elastic, Gloo) with Keras 3 model.fit under hvd_elastic.keras (policy bsp):
hvd_elastic.keras.elastic.KerasState, run and fit, as the Keras elastic recipe of docs/keras.md writes it. The rank set
changes mid-run as in tests/workers/elastic_torch.py (--kill-at: the worker on 127.0.0.1 SIGKILLs itself once;
--remove-at / --add-at: rank 0 rewrites the discovery file; --wait STEP:SIZE: at that global batch every rank commits
until the job has SIZE ranks), counted in global batches (epoch x --steps-per-epoch + batch).

Prints, per rank at the end: ``ELASTIC rank=<r> size=<n> batch=<global batches done> sizes=<sizes seen by rank 0's
state> digest=<crc32 of the weights> resets=<-> resumed=-``, and rank 0 the plugin's report.
"""
import argparse
import os
import signal
import time
import zlib

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402

import hvd_elastic.keras as hvdk  # noqa: E402

import discovery  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--hosts-file", required=True)
ap.add_argument("--np", type=int, default=2)
ap.add_argument("--steps", type=int, default=60, help="global batches in all (--epochs x --steps-per-epoch)")
ap.add_argument("--steps-per-epoch", type=int, default=20)
ap.add_argument("--remove-at", type=int, default=-1)
ap.add_argument("--add-at", type=int, default=-1)
ap.add_argument("--kill-at", type=int, default=-1)
ap.add_argument("--wait", action="append", default=[], help="STEP:SIZE")
ap.add_argument("--host-names", default="")
ap.add_argument("--step-sleep", type=float, default=0.05)
ap.add_argument("--commit-every", type=int, default=1)
args = ap.parse_args()
waits = dict(tuple(map(int, w.split(":"))) for w in args.wait)
epochs = args.steps // args.steps_per_epoch

hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
model.compile(optimizer=opt, loss="mse")
state = hvdk.elastic.KerasState(model, sizes=[])
rng = np.random.default_rng(7)
x = rng.standard_normal((4096, 8)).astype(np.float32)
y = x.sum(1, keepdims=True)


def write_hosts(slots):
    discovery.write_hosts(args.hosts_file, slots, args.host_names)


class Events(keras.callbacks.Callback):
    """The rank-set changes, at known global batches (fit counts the batch before this callback, commits after)."""

    def on_train_batch_end(self, batch, logs=None):
        done = state.epoch * args.steps_per_epoch + state.batch
        if not state.sizes or state.sizes[-1] != hvd.size():
            state.sizes = state.sizes + [hvd.size()]
        if hvd.rank() == 0 and done == args.remove_at:
            write_hosts(args.np - 1)
        if hvd.rank() == 0 and done == args.add_at:
            write_hosts(args.np)
        marker = args.hosts_file + ".killed"
        if done == args.kill_at and os.environ.get("HOROVOD_HOSTNAME") == "127.0.0.1" \
                and not os.path.exists(marker):
            open(marker, "w").close()
            print(f"KILLED rank={hvd.rank()} at batch {done}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.step_sleep)
        while done in waits and hvd.size() != waits[done]:
            time.sleep(0.2)
            state.commit()      # raises HostsUpdatedInterrupt once the driver has changed the rank set


sync = hvdk.SyncCallback()


@hvdk.elastic.run
def train(state):
    # the data of the rank of the moment (ranks renumber at a reset)
    xs, ys = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    hvdk.elastic.fit(model, state, xs, ys, epochs=epochs, steps_per_epoch=args.steps_per_epoch, batch_size=16,
                     batches_per_commit=args.commit_every, callbacks=[sync, Events()], verbose=0)


train(state)
weights = np.concatenate([np.asarray(v.numpy()).ravel() for v in model.trainable_variables])
digest = zlib.crc32(np.ascontiguousarray(weights).tobytes())
print(f"ELASTIC rank={hvd.rank()} size={hvd.size()} batch={state.epoch * args.steps_per_epoch + state.batch} "
      f"sizes={','.join(map(str, state.sizes))} digest={digest} resets=- resumed=-", flush=True)
