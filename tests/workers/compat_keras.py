"""Worker: Horovod's Keras DistributedOptimizer keyword arguments through hvd_elastic.keras (2 ranks).

- accepted under bsp with Horovod's meaning: compression=hvd.Compression.fp16 (the averaged gradient is the fp16
  average, checked on one eager apply against the exact value), sparse_as_dense, op, then a short model.fit:
  identical weights on both ranks;
- refused under asp: compression=fp16 -> one ConfigError line naming compression and policy bsp.
Prints 'compat keras: ok' on rank 0.
"""
import os

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvd_elastic.keras as hvdk
from hvd_elastic.errors import ConfigError


def main():
    hvd.init()
    os.environ.setdefault("HVD_ELASTIC_REPORT", "0")
    # Accepted under bsp: one eager apply of a known gradient with fp16 compression.
    v = keras.Variable(np.zeros(3, np.float32))
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=hvd.Compression.fp16,
                                    sparse_as_dense=True, op=hvd.Average, policy="bsp")
    g = np.full(3, 1.0 / 3.0 + hvd.rank(), np.float32)              # average over 2 ranks: 0.8333...
    opt.apply([tf.constant(g)], [v])
    fp16_avg = float(np.mean([np.float16(1 / 3 + r) for r in range(2)], dtype=np.float32).astype(np.float16))
    got = -np.asarray(v.numpy())
    assert np.allclose(got, fp16_avg, rtol=0, atol=1e-6), (got, fp16_avg)
    assert abs(got[0] - (1 / 3 + 0.5)) > 1e-5, "no fp16 rounding: compression was not applied"
    # ... and model.fit with it.
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.fp16,
                                    sparse_as_dense=True)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(64, 8)).astype(np.float32), rng.integers(0, 2, 64)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[hvdk.SyncCallback()])
    w = np.concatenate([np.asarray(t).ravel() for t in model.get_weights()])
    everyone = hvd.allgather_object(w.tobytes(), name="compat.keras.w")
    assert everyone[0] == everyone[1], "weights differ across ranks"
    # Refused under asp, one line naming the argument and the policy.
    try:
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.fp16, policy="asp")
        raise AssertionError("compression was accepted under asp")
    except ConfigError as e:
        msg = str(e)
        assert "compression" in msg and "policy asp" in msg and "policy bsp" in msg and "\n" not in msg, msg
    # The defaults are accepted under every policy (the same Horovod call carries over).
    hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.none, sparse_as_dense=False,
                              policy="asp")
    if hvd.rank() == 0:
        print("compat keras: ok", flush=True)


if __name__ == "__main__":
    main()
