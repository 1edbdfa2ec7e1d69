"""Horovod's TF2 Keras synthetic benchmark on Keras 3, with hvd_elastic.keras, under the policy in HVD_ELASTIC_POLICY.

The shape of Horovod's examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py (model.fit on a repeated
synthetic batch, one epoch per benchmark iteration, the first epoch a warm-up, a timing callback) with a small CNN
on 32x32 images instead of ResNet-50 on 224x224, so that it runs on a CPU in seconds. Horovod's own Keras layer
does not work on Keras 3; the optimizer and callbacks here are hvd_elastic.keras's (docs/keras.md).

    HVD_ELASTIC_POLICY=bsp horovodrun -np 2 -H localhost:2 --gloo python examples/keras_synthetic_benchmark.py
    HVD_ELASTIC_POLICY=wbsp mpirun -np 2 python examples/keras_synthetic_benchmark.py
    HVD_ELASTIC_POLICY=lbbsp mpirun -np 2 python examples/keras_synthetic_benchmark.py   # B = 2 x --batch-size

Under lbbsp the input is ``hvd_elastic.keras.lbbsp_dataset`` over --num-batches-per-iter global batches of
synthetic data (one epoch = one iteration); each rank's batch has the size the policy gives it and img/sec counts
the images the rank took. ``--fp16-allreduce`` (Horovod's fp16 compression) works under bsp; the other policies
refuse it with one line. Prints, on rank 0, rank 0's img/sec per iteration, the plugin's end-of-run report, then
"Img/sec per rank: mean +-1.96 std" (averaged over the ranks) and the total over ranks (the sum of their means).
"""
import argparse
import os
from timeit import default_timer as timer

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)   # several ranks per machine: one thread each
tf.config.threading.set_inter_op_parallelism_threads(1)
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402

import hvd_elastic.keras as hvde  # noqa: E402

MODELS = ("cnn", "mlp")


def make_model(name, image_size, num_classes):
    """A small Keras model defined here: 'cnn' (two conv blocks) or 'mlp'."""
    layers = keras.layers
    body = ([layers.Conv2D(8, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
             layers.Conv2D(16, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
             layers.Flatten(), layers.Dense(64, activation="relu")] if name == "cnn" else
            [layers.Flatten(), layers.Dense(256, activation="relu")] if name == "mlp" else None)
    if body is None:
        raise ValueError(f"--model must be one of {MODELS}, got {name!r}")
    return keras.Sequential([keras.Input((image_size, image_size, 3)), *body, layers.Dense(num_classes)])


class TimingCallback(keras.callbacks.Callback):
    """img/sec of this rank per epoch (= benchmark iteration); epoch 0 is the warm-up and does not count."""

    def __init__(self, images_of_step, log):
        super().__init__()
        self.images_of_step, self.log = images_of_step, log
        self.img_secs, self.taken = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.images, self.start = 0, timer()

    def on_train_batch_begin(self, batch, logs=None):
        b = self.images_of_step()                # lbbsp: the size decided after the previous step
        self.images += b
        self.taken += b

    def on_epoch_end(self, epoch, logs=None):
        img_sec = self.images / (timer() - self.start)
        self.log(f"Iter #{epoch}: {img_sec:.1f} img/sec per rank (rank 0)" + (" (warm-up)" if epoch == 0 else ""))
        if epoch > 0:
            self.img_secs.append(img_sec)


def main():
    ap = argparse.ArgumentParser(description="Keras synthetic benchmark (hvd-elastic)",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce (Horovod's; policy bsp only)")
    ap.add_argument("--model", default="cnn", choices=MODELS, help="model to benchmark")
    ap.add_argument("--batch-size", type=int, default=32,
                    help="input batch size per rank (lbbsp: the mean share of the global batch)")
    ap.add_argument("--image-size", type=int, default=32, help="side of the synthetic square RGB images")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration (one epoch)")
    ap.add_argument("--num-iters", type=int, default=10,
                    help="number of benchmark iterations (epochs; the first is a warm-up)")
    args = ap.parse_args()
    if args.num_iters < 2:
        ap.error("--num-iters must be at least 2 (the first iteration is a warm-up)")

    hvd.init()
    log = (lambda s: print(s, flush=True)) if hvd.rank() == 0 else (lambda s: None)
    keras.utils.set_random_seed(hvd.rank())   # different on purpose: SyncCallback broadcasts rank 0's weights
    policy = os.environ.get("HVD_ELASTIC_POLICY", "bsp").strip().lower()
    global_batch = args.batch_size * hvd.size()
    extra = {}
    if policy == "lbbsp":
        # A fixed global batch, re-split every step; HVD_ELASTIC_GLOBAL_BATCH, if set, wins (and must agree).
        global_batch = int(os.environ.get("HVD_ELASTIC_GLOBAL_BATCH") or global_batch)
        extra["global_batch"] = global_batch

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}" + (f" (lbbsp: global batch {global_batch})" if policy == "lbbsp" else ""))
    log(f"Number of CPUs (ranks): {hvd.size()}")

    model = make_model(args.model, args.image_size, args.num_classes)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod's Keras call; a relaxed policy refuses fp16 compression here with one line.
    opt = hvde.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=compression, **extra)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)
    log(f"Policy: {hvde.settings(opt).policy}")

    shape = (args.image_size, args.image_size, 3)
    if policy == "lbbsp":
        # One epoch = num_batches_per_iter global batches of B distinct synthetic samples, split by the policy.
        n = global_batch * args.num_batches_per_iter
        rng = np.random.default_rng(0)
        data = rng.uniform(size=(n, *shape)).astype(np.float32)
        target = rng.integers(0, args.num_classes, size=(n,))
        dataset = hvde.lbbsp_dataset(opt, (data, target), seed=0)
        fit_args = {}

        def images_of_step():
            return hvde.batch_sizes(opt)[hvd.rank()]
    else:
        # Horovod's input: one synthetic batch, cached and repeated.
        data = tf.random.uniform([args.batch_size, *shape])
        target = tf.random.uniform([args.batch_size], minval=0, maxval=args.num_classes, dtype=tf.int64)
        dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)
        fit_args = {"steps_per_epoch": args.num_batches_per_iter}

        def images_of_step():
            return args.batch_size

    sync = hvde.SyncCallback(root_rank=0)     # first: broadcast, per-step sync, final sync + report (rank 0)
    timing = TimingCallback(images_of_step, log)
    model.fit(dataset, epochs=args.num_iters, verbose=0, shuffle=False,
              callbacks=[sync, hvde.MetricAverageCallback(), timing], **fit_args)

    # Here every rank holds the same weights and rank 0 has printed the report (sync.report).
    per_rank = hvd.allgather_object((float(np.mean(timing.img_secs)), float(1.96 * np.std(timing.img_secs))))
    means, confs = [m for m, _ in per_rank], [c for _, c in per_rank]
    log(f"Img/sec per rank: {np.mean(means):.1f} +-{np.mean(confs):.1f}")
    log(f"Total img/sec on {hvd.size()} ranks: {sum(means):.1f} +-{sum(confs):.1f}")
    if policy == "lbbsp":
        taken = hvd.allgather_object(timing.taken)  # every step, warm-up epoch included: B a step over the ranks
        log(f"lbbsp: global batch {global_batch}, last batch sizes {hvde.batch_sizes(opt)}, images taken {taken}")


if __name__ == "__main__":
    main()
