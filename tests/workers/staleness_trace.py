"""Worker: 2 ranks under asp with HVD_ELASTIC_MAX_INFLIGHT=0, rank 0 stepping every ~200 ms and rank 1 every
~740 ms (a sleep standing for the forward pass, before backward, so the push made when backward ends closes a
window as long as the step), for a fixed wall time. Each rank writes, per step, the wall time its step started (when
the previous opt.step() returned: the weights it computes on are fixed from then), the time its backward ended (its
push from the second step on, HVD_ELASTIC_PUSH_AT_BACKWARD) and the time it called opt.step() (its push in the first
step), and the end-of-run report with the engine's per-update staleness trace."""
import json
import os
import sys
import time

import horovod.torch as hvd
import torch

import hvd_elastic.torch as hvde


def main():
    out_dir, duration = sys.argv[1], float(sys.argv[2])
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters())
    period = (0.2, 0.74)[hvd.rank()]
    hvd.allreduce(torch.zeros(1), name="start")
    end = time.time() + duration
    steps, start = [], time.time()
    while time.time() < end:
        opt.zero_grad()
        time.sleep(period)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        backward_end = time.time()
        push = time.time()
        opt.step()
        steps.append([start, backward_end, push])
        start = time.time()
    report = hvde.finish(opt)
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "steps": steps, "report": report}, f)


if __name__ == "__main__":
    main()
