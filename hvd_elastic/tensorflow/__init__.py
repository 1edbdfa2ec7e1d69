"""hvd-elastic for TensorFlow custom training loops (GradientTape) with Keras 3 optimizers.

Only ``horovod.tensorflow`` ops are used. Choose the policy with ``HVD_ELASTIC_POLICY`` (or ``policy=``)::

    import horovod.tensorflow as hvd
    import hvd_elastic.tensorflow as hvde

    hvd.init()
    opt = hvde.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size()))

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    with hvde.training(opt):
        while hvde.global_steps(opt) < total_steps:
            opt.apply_gradients(zip(gradients(x, y), model.trainable_variables))   # eagerly
    # every rank holds the same weights; rank 0 has printed where the time went

Under bsp ``apply_gradients`` averages the gradients exactly (one grouped allreduce) and may also be called inside a
``tf.function``. Under the relaxed policies it must be called eagerly: it hands the gradient (wbsp: the model delta
after a local step) to the sync engine. The first eager call broadcasts the trained variables and the optimizer
state from rank 0; call :func:`broadcast_variables` yourself for other variables, or when ``apply_gradients`` only
runs inside a ``tf.function``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict

from ._core import broadcast_variables, state_of, wrap_optimizer


def DistributedOptimizer(optimizer, **policy_kwargs):
    """Wrap a Keras 3 optimizer instance (same object, same state) so that ``apply_gradients`` / ``apply`` run
    under the configured policy. Any hvd-elastic knob may be passed as a keyword (``policy="ssp"``,
    ``staleness=3``, ...) and wins over its ``HVD_ELASTIC_*`` variable. Collective: call it on every rank.
    Raises ConfigError (one line, on every rank) for bad settings or ranks that disagree."""
    return wrap_optimizer(optimizer, policy_kwargs, "TensorFlow")


def global_steps(optimizer) -> int:
    """Steps taken by all ranks together, as far as this rank knows (see hvd_elastic.torch.global_steps)."""
    return state_of(optimizer, "global_steps").global_steps()


def settings(optimizer):
    """The settings the optimizer runs under (``settings(opt).policy``; ``settings(opt).spec``: what the policy is)."""
    return state_of(optimizer, "settings").cfg


def finish(optimizer) -> Dict[str, Any]:
    """Collective end of training: deliver and apply every pushed update, leave all ranks with identical weights,
    and report. Returns the report (a dict) on every rank; rank 0 prints it unless HVD_ELASTIC_REPORT=0."""
    return state_of(optimizer, "finish").finish()


@contextlib.contextmanager
def training(optimizer):
    """Context manager around the training loop: calls :func:`finish` when the loop ends normally."""
    yield optimizer
    finish(optimizer)


__all__ = ["DistributedOptimizer", "broadcast_variables", "finish", "global_steps", "settings", "training"]
