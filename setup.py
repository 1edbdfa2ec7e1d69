"""hvd-elastic: relaxed synchronization models for Horovod jobs.

The native scheduler (native/, C++17, framework-free) is compiled into ``hvd_elastic._native`` with pybind11:
every ``native/src/*.cc`` plus ``native/bindings/*.cc``. It never links torch or TensorFlow.
"""
import glob
import os

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

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

setup(
    name="hvd-elastic",
    version="0.1.0",
    description="Free Horovod jobs from their slowest worker: ElasticBSP/ZipLine, DSSP, SSP, ASP, LB-BSP, WBSP.",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["hvd_elastic", "hvd_elastic.*"]),
    package_data={"hvd_elastic": ["py.typed", "*.pyi"]},
    ext_modules=[native],
    cmdclass={"build_ext": build_ext},
    install_requires=["horovod==0.28.1", "numpy"],
    extras_require={"torch": ["torch>=2.1"], "tensorflow": ["tensorflow>=2.16"], "test": ["pytest", "hypothesis"]},
    zip_safe=False,
)
