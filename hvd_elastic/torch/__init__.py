"""hvd-elastic for PyTorch: a drop-in ``DistributedOptimizer`` whose synchronization model is a policy.

Swap one import; choose the policy with ``HVD_ELASTIC_POLICY`` (or the ``policy=`` keyword)::

    import horovod.torch as hvd
    import hvd_elastic.torch as hvde

    hvd.init()
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with hvde.training(opt):
        for x, y in loader:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    # here every rank holds the same weights; rank 0 has printed where the time went
"""
from .lbbsp import LbbspSampler, batch_sizes
from .optimizer import DistributedOptimizer, finish, global_steps, settings, training

__all__ = ["DistributedOptimizer", "LbbspSampler", "batch_sizes", "finish", "global_steps", "settings", "training"]
