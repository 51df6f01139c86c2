"""The compiled twins of the hot paths, listed in shards/build.py (COMPILED): the
codec's and the ring's core (.pyx), and pure modules compiled as they are, typed
by .pxd files (the gateway's shard link, the shard's loop, state machine, rings,
outbox, queues and batch codec). Everything else is in pyproject.toml. All are
optional: without a C compiler (or, building without isolation, without Cython)
the install goes on and the pure Python twins serve."""

import glob
import os
import runpy
import tempfile

from setuptools import Extension, setup

JOBS = os.cpu_count() or 1  # translate and compile the extensions side by side

# The one list, read from its module (which imports nothing of Warren's) by path:
# the package is not importable while it is being built.
build = runpy.run_path("shards/build.py")
COMPILED, extension_name = build["COMPILED"], build["extension_name"]
TYPED = [source for source in COMPILED if source.endswith(".py")]  # pure modules: see below

try:
    from Cython.Build import cythonize
except ImportError:  # pyproject.toml asks for it; only a build without isolation lacks it
    extensions = []
else:
    # A .pxd is found by the module's installed name (warren.shards._ring), and one
    # cimports another's types by it, so that the compiled modules call each other's
    # methods as C functions: Cython finds them through a folder where `warren` is
    # this tree.
    with tempfile.TemporaryDirectory(prefix="warren-pxd-") as include:
        os.symlink(os.path.abspath(os.path.dirname(__file__) or "."),
                   os.path.join(include, "warren"))
        extensions = cythonize(
            [Extension(extension_name(source), [source])
             for source in COMPILED if source.endswith(".pyx")],
            compiler_directives={"language_level": 3}, include_path=[include],
            nthreads=JOBS)
        # Pure modules compiled as they are, typed by the .pxd of their extension's
        # name where there is one (gateway/io/_shardlink.pxd for gateway/io/shardlink.py):
        # the .py stays the pure twin (its annotations are for readers). Cython looks
        # for that .pxd by the module's name within the source tree, where the
        # packages are `gateway` and `shards`: named so for Cython, renamed for the
        # install.
        # cythonize does not see that a module's .pxd, named apart, or one it
        # cimports by its installed name changed: a changed .pxd translates them all
        # again (types that disagree between modules would refuse to import).
        typing = max(os.path.getmtime(pxd) for pxd in glob.glob("**/_*.pxd", recursive=True))
        for source in TYPED:
            generated = source[:-len(".py")] + ".c"
            if os.path.exists(generated) and os.path.getmtime(generated) < typing:
                os.remove(generated)
        typed = cythonize(
            [Extension(extension_name(source).removeprefix("warren."), [source])
             for source in TYPED],
            compiler_directives={"language_level": 3, "annotation_typing": False},
            include_path=[include], nthreads=JOBS)
    for extension in typed:
        extension.name = "warren." + extension.name
    extensions += typed
    for extension in extensions:  # cythonize drops it: a failed build must not stop the install
        extension.optional = True

setup(ext_modules=extensions, options={"build_ext": {"parallel": JOBS}})
