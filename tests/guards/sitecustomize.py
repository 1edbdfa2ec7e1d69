"""Test guard, active in every job the tests launch (tests/launch.py puts this folder on PYTHONPATH): a tensor that
requires grad handed to one of horovod.torch's collectives as its output (an in-place op: allreduce_, broadcast_,
broadcast_parameters on Parameters) fails the job at once, on the CPU too.

On a GPU without GPU collectives Horovod stages CUDA tensors through host memory and copies each result back with
``Tensor.copy_`` in its background thread, where autograd is on, so such a call aborts the whole process there
(docs/design.md, "CUDA"); on the CPU Horovod writes raw memory and nothing would show it. The guard patches
``horovod.torch.mpi_ops`` when it is first imported (a meta-path hook: jobs that never import it are untouched).

Launcher speed-up, in the `horovodrun` process only: before it starts any rank, horovodrun asks whether Horovod was
built with Gloo (and, without --gloo, with MPI) by forking a process that imports horovod.tensorflow -- about 9 s of
wall time per launch on this machine's two cores, in every test that runs horovodrun. The test session asks Horovod's
build once (tests/launch.py, `horovod_build`) and hands the answers over in HVDE_TEST_HOROVOD_BUILT; horovodrun's
`gloo_built` / `mpi_built` return them. Everything else horovodrun does (its arguments, rendezvous, the ranks it
starts and watches) is untouched. tests/test_wheel.py runs horovodrun without this folder on the path, probe included.
"""
import functools
import importlib.abc
import importlib.machinery
import os
import sys

_MODULE = "horovod.torch.mpi_ops"
# low-level function -> positions of its output arguments (a tensor, or a list of tensors)
_OUTPUTS = {"_allreduce_async": (1,), "_grouped_allreduce_async": (1,), "_broadcast_async": (1,),
            "_allgather_async": (1,), "_grouped_allgather_async": (1,), "_alltoall_async": (2,),
            "_reducescatter_async": (1,), "_grouped_reducescatter_async": (1,)}


def _check(fn_name, args):
    for pos in _OUTPUTS[fn_name]:
        out = args[pos] if len(args) > pos else None
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if getattr(t, "requires_grad", False):
                raise RuntimeError(f"test guard: a tensor that requires grad (shape {tuple(t.shape)}) was handed to "
                                   f"Horovod's {fn_name.strip('_')} as its output: on a GPU without GPU collectives "
                                   f"this aborts the process; pass tensor.detach()")


def _patch(module):
    for fn_name in _OUTPUTS:
        fn = getattr(module, fn_name, None)
        if fn is None or getattr(fn, "_test_guard", False):
            continue

        def guarded(*args, _fn=fn, _name=fn_name, **kwargs):
            _check(_name, args)
            return _fn(*args, **kwargs)

        guarded = functools.wraps(fn)(guarded)
        guarded._test_guard = True
        setattr(module, fn_name, guarded)


def _answer_build_probes(module):
    """horovod.common.util: gloo_built / mpi_built answer from HVDE_TEST_HOROVOD_BUILT ("gloo=1,mpi=1")."""
    built = dict(item.split("=") for item in os.environ["HVDE_TEST_HOROVOD_BUILT"].split(","))
    module.gloo_built = lambda verbose=False: built["gloo"] == "1"
    module.mpi_built = lambda verbose=False: built["mpi"] == "1"


_PATCHES = {_MODULE: _patch}
if os.path.basename(sys.argv[0] if sys.argv else "") == "horovodrun" and os.environ.get("HVDE_TEST_HOROVOD_BUILT"):
    _PATCHES["horovod.common.util"] = _answer_build_probes


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _Finder())
