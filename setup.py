"""hvd-elastic: relaxed synchronization models for Horovod jobs (metadata: pyproject.toml).

The native scheduler (native/, C++17, framework-free) is compiled into ``hvd_elastic._native`` with pybind11:
every ``native/src/*.cc`` plus ``native/bindings/*.cc``. It never links torch or TensorFlow.
"""
import glob
import os

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _rel(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


native = Pybind11Extension(
    "hvd_elastic._native",
    sources=_rel("native/src/*.cc") + _rel("native/bindings/*.cc"),
    include_dirs=["native/include"],
    cxx_std=17,
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)

# Metadata, packages and package data are in pyproject.toml (the version: hvd_elastic.__version__).
setup(ext_modules=[native], cmdclass={"build_ext": build_ext}, zip_safe=False)
