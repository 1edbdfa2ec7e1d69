"""Worker: Keras 3 model.fit (and custom loops) under hvd_elastic; writes what the tests check, per rank.

--mode bsp:      SGD on fixed synthetic data, rank r's data from seed r; model.fit under bsp, then a custom
                 GradientTape loop through hvd_elastic.tensorflow; rank 0 also trains the single-process reference
                 over the combined batch with plain TF. Writes the three weight vectors.
--mode policies: scikit-learn digits, model.fit with a global step budget under each policy of --policies (passed as
                 the policy= keyword), then (--custom-loop POLICY) one custom-loop run; writes accuracy, weight hash,
                 local steps and report per run.
--mode mixed:    a torch job (hvd_elastic.torch) then a Keras job (hvd_elastic.keras) in the same process.
--mode config:   only build the optimizer (bad-input tests).
--mode takes a comma-separated list of bsp and policies: both in one process, in that order, in one output.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

if "--mode" in sys.argv and sys.argv[sys.argv.index("--mode") + 1] == "mixed":
    import torch  # noqa: F401  (imported first, as a torch user would)
    import horovod.torch as hvd_torch
    import hvd_elastic.torch as hvde_torch

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402

import hvd_elastic.keras as hvdk  # noqa: E402
import hvd_elastic.tensorflow as hvdtf  # noqa: E402

import faults  # noqa: E402


def flat(model):
    return np.concatenate([np.asarray(v.numpy()).ravel() for v in model.trainable_variables])


def sha(model):
    return hashlib.sha256(flat(model).astype(np.float32).tobytes()).hexdigest()


def small_model(seed, n_in=20, n_out=4):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((n_in,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(n_out)])


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def bsp(steps, batch, lr):
    n = hvd.size()
    data = []
    for r in range(n):
        g = np.random.default_rng(5 + r)
        data.append((g.standard_normal((steps * batch, 20)).astype(np.float32),
                     g.integers(0, 4, steps * batch).astype(np.int64)))
    x, y = data[hvd.rank()]
    out = {}
    # model.fit, compiled normally (graph mode); different initial weights per rank: the broadcast must fix that.
    model = small_model(seed=hvd.rank())
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr))
    model.compile(optimizer=opt, loss=LOSS)
    assert not model.run_eagerly
    sync = hvdk.SyncCallback()
    hist = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                     callbacks=[sync, hvdk.MetricAverageCallback()])
    out["w_fit"] = flat(model).astype(np.float64).tolist()
    out["fit_report"] = sync.report
    out["fit_loss"] = hist.history["loss"]
    # Custom loop (GradientTape), apply_gradients inside a tf.function, then eagerly.
    model2 = small_model(seed=hvd.rank())
    opt2 = hvdtf.DistributedOptimizer(keras.optimizers.SGD(lr))
    opt2.build(model2.trainable_variables)
    hvdtf.broadcast_variables(model2.variables + opt2.variables)

    @tf.function
    def grads_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model2(xb, training=True))
        return tape.gradient(loss, model2.trainable_variables)

    @tf.function
    def graph_step(xb, yb):
        opt2.apply_gradients(zip(grads_fn(xb, yb), model2.trainable_variables))

    for k in range(steps):
        xb, yb = x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch]
        if k < steps // 2:
            graph_step(xb, yb)
        else:
            opt2.apply_gradients(zip(grads_fn(xb, yb), model2.trainable_variables))
    out["loop_report"] = hvdtf.finish(opt2)
    out["w_loop"] = flat(model2).astype(np.float64).tolist()
    if hvd.rank() == 0:   # single process, plain TF: the combined batch of every rank, rank 0's initial weights
        ref = small_model(seed=0)
        ref_opt = keras.optimizers.SGD(lr)
        for k in range(steps):
            xb = np.concatenate([d[0][k * batch:(k + 1) * batch] for d in data])
            yb = np.concatenate([d[1][k * batch:(k + 1) * batch] for d in data])
            with tf.GradientTape() as tape:
                loss = LOSS(yb, ref(xb, training=True))
            ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
        out["w_ref"] = flat(ref).astype(np.float64).tolist()
    return out


def digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def digits_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


class FaultCallback(keras.callbacks.Callback):
    """TEST_FAULT* (tests/workers/faults.py) at the start of a batch."""

    def on_train_batch_begin(self, batch, logs=None):
        faults.inject(batch, hvd.rank(), hvd.size())


def fit_run(policy, target, batch, data):
    x_tr, x_te, y_tr, y_te = data
    rank = hvd.rank()
    g = np.random.default_rng(100 + rank)
    idx = g.integers(0, len(x_tr), target * batch)      # enough for every step this rank could take
    model = digits_model(seed=rank)
    kwargs = {} if policy is None else {"policy": policy}
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), **kwargs)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    sync = hvdk.SyncCallback(global_steps=target)
    hist = model.fit(x_tr[idx], y_tr[idx], batch_size=batch, epochs=1, shuffle=False, verbose=0,
                     callbacks=[sync, hvdk.MetricAverageCallback(), FaultCallback()])
    acc = float((np.argmax(model.predict(x_te, verbose=0), 1) == y_te).mean())
    return {"policy": sync.report["policy"], "accuracy": acc, "weights_sha256": sha(model),
            "fit_loss": hist.history["loss"],
            "local_steps": sync.report["ranks"][rank]["steps"], "report": sync.report}


def loop_run(policy, target, batch, data):
    x_tr, x_te, y_tr, y_te = data
    rank = hvd.rank()
    g = np.random.default_rng(200 + rank)
    model = digits_model(seed=rank)
    opt = hvdtf.DistributedOptimizer(keras.optimizers.Adam(0.01), policy=policy)

    @tf.function
    def grads_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    steps = 0
    with hvdtf.training(opt):
        while hvdtf.global_steps(opt) < target:
            i = g.integers(0, len(x_tr), batch)
            opt.apply_gradients(zip(grads_fn(x_tr[i], y_tr[i]), model.trainable_variables))
            steps += 1
    report = hvdtf.finish(opt)
    acc = float((np.argmax(model(x_te).numpy(), 1) == y_te).mean())
    return {"policy": report["policy"], "accuracy": acc, "weights_sha256": sha(model), "local_steps": steps,
            "report": report}


def mixed(target, batch):
    import torch
    import torch.nn.functional as F
    hvd_torch.init()
    torch.set_num_threads(1)
    data = digits()
    x_tr, x_te, y_tr, y_te = data
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    topt = hvde_torch.DistributedOptimizer(torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.5),
                                           named_parameters=tm.named_parameters())
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    gen = torch.Generator().manual_seed(hvd_torch.rank())
    steps = 0
    while hvde_torch.global_steps(topt) < target:
        i = torch.randint(0, len(xt), (batch,), generator=gen)
        topt.zero_grad()
        F.cross_entropy(tm(xt[i]), yt[i]).backward()
        topt.step()
        steps += 1
    treport = hvde_torch.finish(topt)
    with torch.no_grad():
        tacc = float((tm(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean())
    tw = torch.cat([p.detach().flatten() for p in tm.parameters()]).numpy()
    out = {"torch": {"accuracy": tacc, "weights_sha256": hashlib.sha256(tw.tobytes()).hexdigest(),
                     "local_steps": steps, "report": treport}}
    out["keras"] = fit_run(None, target, batch, data)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--mode", required=True, help="bsp|policies|mixed|config (bsp,policies: both)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--target", type=int, default=300)
    ap.add_argument("--policies", default="")
    ap.add_argument("--custom-loop", default="")
    args = ap.parse_args()
    modes = args.mode.split(",")
    if modes not in (["bsp"], ["policies"], ["bsp", "policies"], ["mixed"], ["config"]):
        ap.error(f"--mode {args.mode!r}: one of bsp, policies, bsp,policies, mixed, config")
    hvd.init()
    out = {"rank": hvd.rank()}
    if "bsp" in modes:
        out.update(bsp(args.steps, args.batch, lr=0.3))
    if "policies" in modes:
        data = digits()
        out["runs"] = [fit_run(p or None, args.target, args.batch, data) for p in args.policies.split(",") if p]
        if args.custom_loop:
            out["runs"].append(loop_run(args.custom_loop, args.target, args.batch, data))
    if modes == ["mixed"]:
        out.update(mixed(args.target, args.batch))
    elif modes == ["config"]:
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
        print(f"config ok on rank {hvd.rank()}: policy={hvdk.settings(opt).policy}", flush=True)
    with open(os.path.join(args.out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
