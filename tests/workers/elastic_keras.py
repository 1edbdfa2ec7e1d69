"""A Horovod elastic job (horovodrun --elastic, Gloo) with Keras 3 model.fit under hvd_elastic.keras (any policy that
runs elastic on Keras, HVD_ELASTIC_POLICY):
hvd_elastic.keras.elastic.KerasState, run and fit, as the Keras elastic recipe of docs/keras.md writes it; with
--custom-loop, a TensorFlow custom loop (GradientTape, hvd_elastic.tensorflow's optimizer, apply_gradients eagerly)
under KerasState and run, as docs/keras.md's custom-loop recipe writes it. Under lbbsp (B: HVD_ELASTIC_GLOBAL_BATCH, 32
by default) model.fit reads hvd_elastic.keras.lbbsp_dataset over --steps-per-epoch x B samples, whose batch plan the
KerasState keeps, and the model carries an audit as tests/workers/elastic_torch.py's does: a layer whose weight `seen`
has one entry per sample and gains exactly 1 each time the sample's gradient goes into a step through lbbsp's exchange,
so that after the epochs seen[i] is --steps / --steps-per-epoch everywhere when every sample was taken once per epoch
over the resets (``audit_off=<samples whose count is not that>``). The rank set changes mid-run as in
tests/workers/elastic_torch.py (--kill-at: the worker on --kill-host SIGKILLs itself once; --remove-at / --add-at: rank
0 rewrites the discovery file; --wait STEP:SIZE: at that global batch every rank commits until the job has SIZE ranks),
counted in global batches (epoch x --steps-per-epoch + batch).

Prints, per rank at the end, the line of tests/workers/elastic_torch.py (batch: global batches done; entry_is_commit:
the custom loop's, '-' under fit), and rank 0 the plugin's report.
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
import hvd_elastic.tensorflow as hvdtf  # noqa: E402

import discovery  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--hosts-file", required=True)
ap.add_argument("--np", type=int, default=2)
ap.add_argument("--steps", type=int, default=60, help="global batches in all (--epochs x --steps-per-epoch)")
ap.add_argument("--steps-per-epoch", type=int, default=20)
ap.add_argument("--remove-at", type=int, default=-1)
ap.add_argument("--add-at", type=int, action="append", default=[], help="repeatable")
ap.add_argument("--kill-at", type=int, default=-1)
ap.add_argument("--kill-host", default="", help="the host whose worker --kill-at kills (default: the last of "
                                                "--host-names, 127.0.0.1 without them)")
ap.add_argument("--wait", action="append", default=[], help="STEP:SIZE")
ap.add_argument("--host-names", default="")
ap.add_argument("--step-sleep", type=float, default=0.05)
ap.add_argument("--commit-every", type=int, default=1)
ap.add_argument("--dataset-inside", action="store_true",
                help="lbbsp: make the dataset inside the elastic function (refused at its second call)")
ap.add_argument("--budget", type=int, default=None, help="SyncCallback(global_steps=...)")
ap.add_argument("--custom-loop", action="store_true", help="a TensorFlow custom loop instead of model.fit")
ap.add_argument("--wait-sleep", type=float, default=3.0,
                help="tick policies: a step's length while a wait is not met (the last wait has the steps left to the "
                     "run's end, 20 x 3 s by default, for a new worker's start-up on a loaded machine)")
args = ap.parse_args()
waits = dict(tuple(map(int, w.split(":"))) for w in args.wait)
epochs = args.steps // args.steps_per_epoch

LBBSP = os.environ.get("HVD_ELASTIC_POLICY") == "lbbsp"
LR = 0.01


class Audit(keras.layers.Layer):
    """lbbsp's audit (the input's last column is the sample's index): a loss term -scale x mean(seen[index]) over the
    rank's batch, whose gradient, weighted by b_p / B in lbbsp's exchange, is -scale / B on each sample of the global
    batch; with SGD at lr = B / scale and no momentum each step adds exactly 1 to seen[i] of its samples."""

    def __init__(self, n, scale):
        super().__init__()
        self.n, self.scale = n, scale

    def build(self, input_shape):
        self.seen = self.add_weight(shape=(self.n,), initializer="zeros", name="seen")

    def call(self, inputs):
        self.add_loss(-self.scale * tf.reduce_mean(tf.gather(self.seen, tf.cast(inputs[:, -1], tf.int32))))
        return inputs[:, :-1]


hvd.init()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(7)
x = rng.standard_normal((4096, 8)).astype(np.float32)
y = x.sum(1, keepdims=True)
layers = [keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
if LBBSP:
    B = int(os.environ.get("HVD_ELASTIC_GLOBAL_BATCH", 32))
    n = args.steps_per_epoch * B
    x = np.concatenate([x[:n], np.arange(n, dtype=np.float32)[:, None]], axis=1)   # the index, for the audit
    y = y[:n]
    audit = Audit(n, B / LR)
    model = keras.Sequential([keras.Input((9,)), audit, *layers])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), global_batch=B)
else:
    model = keras.Sequential([keras.Input((8,)), *layers])
    wrap = hvdtf.DistributedOptimizer if args.custom_loop else hvdk.DistributedOptimizer
    opt = wrap(keras.optimizers.SGD(LR * hvd.size(), momentum=0.9))
if not args.custom_loop:
    model.compile(optimizer=opt, loss="mse")
state = hvdk.elastic.KerasState(model, optimizer=opt, sizes=[])
# Horovod's elastic pattern: the learning rate follows the number of ranks (a reset callback sets it); every step must
# train at the rate of the ranks of the moment (counted: lr_off)
lr_off = [0]
if not LBBSP:
    state.register_reset_callbacks([lambda: opt.learning_rate.assign(LR * hvd.size())])


def check_lr():
    if not LBBSP:
        lr_off[0] += abs(float(opt.learning_rate.numpy()) - LR * hvd.size()) > 1e-6 * LR * hvd.size()
# lbbsp: every rank makes the dataset (its batch plan) before the first fit; the KerasState keeps the plan's place
data = hvdk.lbbsp_dataset(opt, (x, y), seed=0) if LBBSP and not args.dataset_inside else None


def write_hosts(slots):
    discovery.write_hosts(args.hosts_file, slots, args.host_names)


# Under bsp a wait STEP:SIZE holds every rank at that batch, committing, until the job has SIZE ranks. Under a tick
# policy a change of the rank set reaches the ranks through the ticks, which run while the ranks train (only rank 0
# hears the driver, and an idle rank joins no tick): a wait there slows each step to --wait-sleep instead while the
# job does not have SIZE ranks yet (from STEP until the next wait's STEP), and a removal or an addition is made at the
# first batch from its step on at which the wait before it is met. A custom loop trains on during a wait (steps not
# counted), as tests/workers/elastic_torch.py does.
TICKS = os.environ.get("HVD_ELASTIC_POLICY", "bsp") != "bsp" and not args.custom_loop and not LBBSP


def wait_at(done, before=False):
    """The wait in force at batch `done` (before=True: the last one strictly before it), or None."""
    steps = [w for w in sorted(waits) if (w < done if before else w <= done)]
    return steps[-1] if steps else None


def due(done, at, marker):
    """A removal or an addition scheduled at batch `at`: whether rank 0 makes it now (once)."""
    if hvd.rank() != 0 or at < 0 or os.path.exists(marker):
        return False
    if not TICKS:
        return done == at
    prior = wait_at(at, before=True)
    return done >= at and (prior is None or hvd.size() == waits[prior])


def events(done):
    """The rank-set changes after global batch `done`: the sizes seen, a removal or an addition, the kill."""
    if not state.sizes or state.sizes[-1] != hvd.size():
        state.sizes = state.sizes + [hvd.size()]
    changes = [(args.remove_at, args.np - 1, "removed"), *((at, args.np, f"added{at}") for at in args.add_at)]
    for at, slots, name in changes:
        if due(done, at, f"{args.hosts_file}.{name}"):
            open(f"{args.hosts_file}.{name}", "w").close()
            write_hosts(slots)
    marker = args.hosts_file + ".killed"
    if done == args.kill_at and discovery.is_kill_host(args.host_names, args.kill_host) \
            and not os.path.exists(marker):
        open(marker, "w").close()
        print(f"KILLED rank={hvd.rank()} at batch {done}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class Events(keras.callbacks.Callback):
    """The rank-set changes, at known global batches (fit counts the batch before this callback, commits after)."""

    def on_train_batch_begin(self, batch, logs=None):
        check_lr()

    def on_train_batch_end(self, batch, logs=None):
        done = state.epoch * args.steps_per_epoch + state.batch
        events(done)
        time.sleep(args.step_sleep)
        if TICKS:
            w = wait_at(done)
            if w is not None and hvd.size() != waits[w]:
                time.sleep(args.wait_sleep)
            return
        hold(done)


def weights_digest() -> int:
    weights = np.concatenate([np.asarray(v.numpy()).ravel() for v in model.trainable_variables])
    return zlib.crc32(np.ascontiguousarray(weights).tobytes())


# the custom loop: the weights at this rank's last commit, and per train_loop() entry after a reset whether it starts
# with them
commits = discovery.Commits(state, weights_digest)
commit = commits.commit


def hold(done, step=None):
    """A wait at global batch `done` (bsp, lbbsp, the custom loop): every rank commits until the job has the wait's
    size, training on with `step` (steps not counted) where one is given. Called after each batch and when training
    starts again after a reset, which may resume at a wait's batch."""
    while done in waits and hvd.size() != waits[done]:
        if step is not None:
            step()
        time.sleep(0.2)
        commit()      # raises HostsUpdatedInterrupt once the driver has changed the rank set


sync = hvdk.SyncCallback(global_steps=args.budget)


@hvdk.elastic.run
def train(state):
    if not TICKS:
        hold(state.epoch * args.steps_per_epoch + state.batch)
    callbacks = [sync, hvdk.MetricAverageCallback(), Events()]
    if LBBSP:       # the plan deals each global batch over the ranks of the moment
        ds = hvdk.lbbsp_dataset(opt, (x, y), seed=0) if args.dataset_inside else data
        hvdk.elastic.fit(model, state, ds, epochs=epochs, steps_per_epoch=args.steps_per_epoch,
                         batches_per_commit=args.commit_every, callbacks=callbacks, verbose=0)
        return
    # the data of the rank of the moment (ranks renumber at a reset)
    xs, ys = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    hvdk.elastic.fit(model, state, xs, ys, epochs=epochs, steps_per_epoch=args.steps_per_epoch, batch_size=16,
                     batches_per_commit=args.commit_every, callbacks=callbacks, verbose=0)


loss_fn = keras.losses.MeanSquaredError()


@tf.function
def gradients(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    return tape.gradient(loss, model.trainable_variables)


def loop_step(i):
    xs, ys = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    j = (16 * i) % (len(xs) - 16)
    check_lr()
    opt.apply_gradients(zip(gradients(xs[j:j + 16], ys[j:j + 16]), model.trainable_variables))   # eagerly


@hvdk.elastic.run
def train_loop(state):
    commits.entered()
    hold(state.batch, lambda: loop_step(1000 + state.batch))
    while state.batch < args.steps:
        loop_step(state.batch)
        state.batch += 1
        events(state.batch)
        time.sleep(args.step_sleep)
        if state.batch % args.commit_every == 0:
            commit()
        hold(state.batch, lambda: loop_step(1000 + state.batch))


if args.custom_loop:
    train_loop(state)
    report = hvdtf.finish(opt)
else:
    train(state)
    report = sync.report
digest = weights_digest()
counters = [r["counters"] for r in report["ranks"]]
mine = counters[hvd.rank()]


def per_reset(key):
    return discovery.listed(mine.get(key, []))


# pushed: every final rank's pushes into the last engine (the one built after the last reset); applied: the updates
# of all ranks in the ticks this rank applied -- equal when nothing was lost or applied twice since that reset
print(f"ELASTIC rank={hvd.rank()} size={hvd.size()} batch={state.epoch * args.steps_per_epoch + state.batch} "
      f"global={hvdk.global_steps(opt)} sizes={','.join(map(str, state.sizes))} digest={digest} "
      f"pushed={sum(c.get('pushed', 0) for c in counters)} applied={mine.get('applied_contributions', 0)} "
      f"resets={mine.get('elastic_resets', 0)} resumed={per_reset('elastic_resumed_from_updates')} "
      f"lost={per_reset('elastic_lost_updates')} in_flight={per_reset('elastic_in_flight_updates')} "
      f"beyond_commit={per_reset('elastic_beyond_commit_updates')} "
      f"entry_is_commit={discovery.listed(commits.entry_is_commit)} lr_off={lr_off[0]} "
      f"loads={mine.get('elastic_replica_loads', 0)} replaced={mine.get('elastic_sync_replaced', 0)}"
      f"{f' audit_off={int((np.abs(audit.seen.numpy() - epochs) > 1e-3).sum())}' if LBBSP else ''}", flush=True)
