"""Momentum under relaxed gradient policies (HVD_ELASTIC_MOMENTUM_PER): a tick may carry part of a round of n
gradients, or more than one round, while Horovod's optimizer decays momentum once per n gradients (one step on their
average). These keep the decay per round however the ticks split it."""
from __future__ import annotations

from typing import Any, Callable

import torch


class RoundSgd:
    """HVD_ELASTIC_MOMENTUM_PER=round for torch.optim.SGD with momentum (not Nesterov): Horovod's arithmetic for a
    round of n gradients however it splits over ticks. Ticks carry counts; in cumulative counts round r starts at
    r x n. The tick in which a round starts runs SGD's own step (momentum buffer v <- m v + g, weights -= lr v); a tick
    that continues a started round adds its gradient to v without decaying it and moves the weights by lr x that
    gradient only. A round split as (g_a, g_b) then moves the weights by lr (m v + g_a + g_b) and leaves v = m v + g_a
    + g_b, exactly one SGD step on the round; momentum^(k/n) per tick (the share rule) moves them by lr ((m^(1 - k/n)
    + m) v + (1 + m^(k/n)) g_a + g_b) instead (at m = 0.5 and k/n = 3/4: 0.59 v + 0.84 g_a too much).
    Design: docs/design.md, "Gradient policies" (Momentum); tested: tests/test_torch_buffers.py."""

    def __init__(self, optimizer, step: Callable[[], Any], size: int):
        self.optimizer, self.step, self.size = optimizer, step, size
        self.delivered = 0          # gradients applied so far (cumulative tick counts)

    @staticmethod
    def applies(optimizer) -> bool:
        return isinstance(optimizer, torch.optim.SGD) and not any(g.get("nesterov") for g in optimizer.param_groups)

    def __call__(self, count: int):
        n, before = self.size, self.delivered
        self.delivered += count
        starts = -(-self.delivered // n) - -(-before // n)    # round starts r x n with before <= r x n < after
        # Weight decay is part of the round's gradient: each tick adds its share k / n of it.
        saved = [(g, g["weight_decay"]) for g in self.optimizer.param_groups if g["weight_decay"]]
        for g, wd in saved:
            g["weight_decay"] = wd * count / n
        try:
            if starts >= 1 or not self._buffers_exist():
                step_with_momentum_share(self.optimizer, self.step, float(max(starts, 1)))   # m^starts: m per round
            else:
                self._continue_round()
        finally:
            for g, wd in saved:
                g["weight_decay"] = wd

    def _buffers_exist(self) -> bool:
        opt = self.optimizer
        return all(opt.state.get(p, {}).get("momentum_buffer") is not None
                   for g in opt.param_groups if g["momentum"] for p in g["params"] if p.grad is not None)

    @torch.no_grad()
    def _continue_round(self):
        """v += (1 - dampening) g and weights -= lr (1 - dampening) g per group, g = the gradient (+ weight decay),
        in fused foreach ops (momentum 0: weights -= lr g, SGD's own step)."""
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr, wd, m, damp = float(group["lr"]), group["weight_decay"], group["momentum"], group["dampening"]
            sign = -1.0 if group.get("maximize") else 1.0
            grads = [p.grad for p in params]
            if wd:
                grads = torch._foreach_add(grads, params, alpha=sign * wd)   # sign x (sign g + wd w): one sign below
            keep = (1.0 - damp) if m else 1.0
            if m:
                torch._foreach_add_([self.optimizer.state[p]["momentum_buffer"] for p in params], grads,
                                    alpha=sign * keep)
            torch._foreach_add_(params, grads, alpha=-lr * sign * keep)


def step_with_momentum_share(optimizer, step: Callable[[], Any], share: float):
    """Run `step` (the optimizer's own step) for a tick that carries `share` (k / n) of a round of gradients: every
    param group's momentum in (0, 1) (SGD, RMSprop) is momentum^share during it, so momentum advances once per n
    gradients, as under Horovod, however a round is split over ticks; read at every tick (a scheduler may cycle it)
    and restored after. A share above 1 (a tick with more than n gradients) decays it by momentum^share."""
    if share == 1.0:
        step()
        return
    saved = [(g, g["momentum"]) for g in optimizer.param_groups
             if isinstance(g.get("momentum"), (int, float)) and 0.0 < g["momentum"] < 1.0]
    for g, m in saved:
        g["momentum"] = m ** share
    try:
        step()
    finally:
        for g, m in saved:
            g["momentum"] = m
