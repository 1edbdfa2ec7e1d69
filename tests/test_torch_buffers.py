"""The torch side of the data plane's layout (hvd_elastic/torch/buffers.py), single process: what the replica
check and the streamed push read must be exactly the flat layout's words."""
import numpy as np
import pytest
import torch

from hvd_elastic.torch.buffers import FlatParams


def _flat():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Linear(13, 5), torch.nn.Conv1d(3, 4, 3))
    return model, FlatParams(model.parameters())


def test_sampled_weights_are_every_kth_word_of_the_flat_copy():
    _, flat = _flat()
    w = flat.weights().numpy().copy()
    for k in (1, 2, 3, 5, 7, 11, 64, flat.numel, 10 * flat.numel):
        assert np.array_equal(flat.sample_weights(k), w[::k]), k


def test_accumulate_range_adds_exactly_the_words_of_the_flat_gradient():
    model, flat = _flat()
    out = model[2](torch.randn(2, 3, 6)).sum() + model[1](model[0](torch.randn(4, 7))).pow(2).sum()
    out.backward()
    start = torch.randn(flat.numel)
    whole = start.clone()
    flat.accumulate_gradients(whole, 0.5)
    bounds = [0, 30, 31, 150, flat.numel]       # ranges that cut through parameters
    pieces = start.clone()
    for a, b in zip(bounds, bounds[1:]):
        flat.accumulate_range(pieces[a:b], a, b, 0.5)
    assert torch.equal(pieces, whole) and not torch.equal(whole, start)


def test_a_split_round_advances_momentum_once_per_round():
    """HVD_ELASTIC_MOMENTUM_PER=round: two ticks carrying half a round each decay SGD's momentum buffer by m in
    total (m^(1/2) each), as one tick with the whole round does; the group's momentum is restored after each."""
    from hvd_elastic.torch.optimizer import step_with_momentum_share

    def run(shares, grads):
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        opt = torch.optim.SGD([p], lr=1.0, momentum=0.81)
        p.grad = torch.ones(3, dtype=torch.float64)
        opt.step()                                            # buffer = 1
        for share, g in zip(shares, grads):
            p.grad = torch.full((3,), g, dtype=torch.float64)
            step_with_momentum_share(opt, opt.step, share)
            assert opt.param_groups[0]["momentum"] == 0.81
        return opt.state[p]["momentum_buffer"]

    whole = run([1.0], [2.0])                                   # 0.81 * 1 + 2
    split = run([0.5, 0.5], [1.0, 1.0])                         # 0.9 * (0.9 * 1 + 1) + 1
    assert torch.allclose(whole, torch.full((3,), 2.81, dtype=torch.float64))
    assert torch.allclose(split, torch.full((3,), 0.9 * 1.9 + 1, dtype=torch.float64))
    # the old buffer's decay is the same: m over the round, whichever way it is split
    assert torch.allclose(run([0.5, 0.5], [0.0, 0.0]), run([1.0], [0.0]))


@pytest.mark.parametrize("wd,damp,maximize", [(0.0, 0.0, False), (1e-2, 0.1, False), (1e-2, 0.0, True)])
def test_a_round_split_over_ticks_is_one_sgd_step(wd, damp, maximize):
    """HVD_ELASTIC_MOMENTUM_PER=round with SGD: rounds of n = 4 gradients arriving as ticks of 4, 3 + 1, 1 + 2 + 1 and
    2 + 2 leave the weights and the momentum buffer where one SGD step per round leaves them (Horovod's arithmetic);
    the share rule (momentum^(k/n) per tick) does not."""
    from hvd_elastic.torch.optimizer import RoundSgd, step_with_momentum_share
    n = 4
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(16)]   # 4 rounds of 4 gradients

    def model():
        p = torch.nn.Parameter(torch.linspace(-1, 1, 5, dtype=torch.float64))
        return p, torch.optim.SGD([p], lr=0.3, momentum=0.5, weight_decay=wd, dampening=damp, maximize=maximize)

    def apply(opt, p, chunk):        # a tick: the mean over n of the gradients it carries
        p.grad = sum(chunk) / n
        return len(chunk)

    p_ref, opt_ref = model()
    for r in range(4):
        apply(opt_ref, p_ref, grads[4 * r:4 * r + 4])
        opt_ref.step()
    # the first round whole (SGD's first step takes the buffer undamped), then split: cumulative 4 | 7, 8 | 9, 11, 12 |
    # 14, 16
    ticks = [4, 3, 1, 1, 2, 1, 2, 2]
    errors = {}
    for rule in ("round", "share"):
        p, opt = model()
        rounds, done = RoundSgd(opt, opt.step, n), 0
        for k in ticks:
            apply(opt, p, grads[done:done + k])
            done += k
            if rule == "round":
                rounds(k)
            else:
                step_with_momentum_share(opt, opt.step, k / n)
        errors[rule] = max(float((p - p_ref).detach().abs().max()),
                           float((opt.state[p]["momentum_buffer"]
                                  - opt_ref.state[p_ref]["momentum_buffer"]).abs().max()))
    if wd == 0.0:
        assert errors["round"] < 1e-12 < 1e-3 < errors["share"], errors       # exact, against a visible error
    else:   # weight decay is taken at each tick's weights (BSP: the round's first): exact up to lr x wd x a step
        assert errors["round"] < 2e-3 and errors["round"] < errors["share"] / 10, errors
