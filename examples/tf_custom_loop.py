"""A TensorFlow custom training loop (GradientTape, Keras 3 optimizer) under hvd-elastic, on scikit-learn's digits.

Launch (2 ranks; rank 1 an emulated straggler):

    HVD_ELASTIC_POLICY=ssp HVD_ELASTIC_EMULATE_DELAY='1:0.02' \
        horovodrun -np 2 -H localhost:2 --gloo python examples/tf_custom_loop.py
    HVD_ELASTIC_POLICY=wbsp mpirun -np 2 python examples/tf_custom_loop.py

The gradients are computed in a tf.function; apply_gradients is called eagerly (needed by the relaxed policies;
under bsp it may also be called inside a tf.function).
"""
import argparse

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvd_elastic.tensorflow as hvde  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="global step budget (all ranks together)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_tr, y_tr = x_tr[hvd.rank()::hvd.size()], y_tr[hvd.rank()::hvd.size()]

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = hvde.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.5))

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    rng = np.random.default_rng(1000 + hvd.rank())
    with hvde.training(opt):     # the first apply broadcasts rank 0's weights; the end: final sync + report
        while hvde.global_steps(opt) < args.steps:
            i = rng.integers(0, len(x_tr), args.batch_size)
            opt.apply_gradients(zip(gradients(x_tr[i], y_tr[i]), model.trainable_variables))
    acc = float((np.argmax(model(x_te).numpy(), 1) == y_te).mean())
    if hvd.rank() == 0:
        print(f"tf_custom_loop: ranks={hvd.size()} test accuracy={acc:.3f}", flush=True)


if __name__ == "__main__":
    main()
