"""Build the Cython kernels in cyext/ into grudge_stream._cyext, and install the shipped
topologies (topologies/ in the source tree) as grudge_stream.topologies; all else is in
pyproject.toml.

Set GRUDGE_DEBUG=1 to build with bounds checks, wraparound, C assertions and -O0 -g.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

DEBUG = os.environ.get("GRUDGE_DEBUG", "") not in ("", "0")
# The kernels are translated and compiled side by side, one job per core (about half the build
# time on two cores).
JOBS = os.cpu_count() or 1

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "nonecheck": False,
    "embedsignature": True,
    "binding": True,
}
# -ffp-contract=off: no fused multiply-add, so float results match the pure-Python
# reference models bit for bit on every platform (aarch64 would otherwise fuse).
cflags = ["-ffp-contract=off"] + (["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3", "-fno-strict-aliasing"])

extensions = [
    Extension(
        f"grudge_stream._cyext.{os.path.splitext(os.path.basename(pyx))[0]}",
        [pyx],
        include_dirs=["cyext", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=cflags,
        # _native resolves librdkafka at run time (dlopen): no link-time dependency on it.
        libraries=["dl"] if pyx.endswith("_native.pyx") else [],
    )
    for pyx in sorted(glob.glob("cyext/_*.pyx"))
]

setup(
    # topologies/ sits at the top of the source tree, beside grudge_stream/, and installs as
    # grudge_stream.topologies: no generic top-level "topologies" package in site-packages.
    # tools/ (the dev broker, tools/devkafka) is a distribution of its own, never in this wheel.
    packages=[*find_packages(include=["grudge_stream", "grudge_stream.*"]), "grudge_stream.topologies"],
    package_dir={"grudge_stream.topologies": "topologies"},
    ext_modules=cythonize(
        extensions,
        include_path=["cyext"],
        compiler_directives=directives,
        build_dir="build/cython",
        nthreads=JOBS,
    ),
    options={"build_ext": {"parallel": JOBS}},
)
