"""The torch side of the data plane's layout (hvd_elastic/torch/buffers.py), single process: what the replica
check and the streamed push read must be exactly the flat layout's words."""
import numpy as np
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
