"""Build the unimem Python package with the project's CMake build.

The extension unimem._core, libunimem_torch.so and the shared libunimem are
built by CMake (only the library and the package: no tests, benchmarks,
tools or examples) and copied into the package, where the extension and
the allocator find libunimem through their RPATH ($ORIGIN). Debian's
python3-setuptools is the build backend; pyproject.toml says how to call it.
Environment: UNIMEM_CMAKE_ARGS adds CMake arguments (say
"-DUNIMEM_ENABLE_CUDA=OFF"), CMAKE the cmake to run.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    text = open(os.path.join(HERE, "include", "unimem_version.h")).read()
    parts = [re.search(r"UM_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class CMakeBuild(build_ext):
    """Configure and build with CMake; the package directory it makes is the package."""

    def build_extension(self, ext):
        cmake = os.environ.get("CMAKE", "cmake")
        if shutil.which(cmake) is None:
            raise RuntimeError("unimem: cmake is needed to build the package (apt-get install cmake)")
        work = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(work, exist_ok=True)
        args = [cmake, "-S", HERE, "-B", work, "-DCMAKE_BUILD_TYPE=Release",
                "-DUNIMEM_BUILD_TESTS=OFF", "-DUNIMEM_BUILD_BENCH=OFF", "-DUNIMEM_BUILD_TOOLS=OFF",
                "-DUNIMEM_BUILD_EXAMPLES=OFF", "-DUNIMEM_WERROR=OFF", "-DUNIMEM_BUILD_PYTHON=ON",
                "-DUNIMEM_PYTHON_BUNDLE=ON", "-DPython3_EXECUTABLE=" + sys.executable]
        args += shlex.split(os.environ.get("UNIMEM_CMAKE_ARGS", ""))
        jobs = str(self.parallel or os.cpu_count() or 1)
        subprocess.check_call(args)
        subprocess.check_call([cmake, "--build", work, "--target", "unimem_python", "-j", jobs])
        built = os.path.join(work, "python", "unimem")
        target = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(target, exist_ok=True)
        for name in sorted(os.listdir(built)):
            if name.endswith(".so") or ".so." in name:
                shutil.copy2(os.path.join(built, name), os.path.join(target, name))


setup(
    version=version(),
    packages=["unimem"],
    package_dir={"unimem": "python/unimem"},
    package_data={"unimem": ["__init__.pyi", "py.typed"]},
    ext_modules=[Extension("unimem._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-py"}},  # not build/, the CMake tree of the README's commands
    zip_safe=False,
)
