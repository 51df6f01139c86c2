"""The compiled twins of the hot paths: the codec's (gateway/amqp/_hotpath.pyx),
the ring's core (shards/_ring.pyx), the gateway's shard link, and the shard's
loop, state machine, rings, outbox, queues and batch codec (their pure modules
compiled as they are, typed by .pxd files).
Everything else is in pyproject.toml. All are optional: without a C compiler
(or, building without isolation, without Cython) the install goes on and the
pure Python twins serve."""

import glob
import os
import tempfile

from setuptools import Extension, setup

JOBS = os.cpu_count() or 1  # translate and compile the extensions side by side

# The steady path, compiled from its pure modules (see below).
TYPED = [("gateway/io", "shardlink"), ("shards", "gatewayrings"), ("shards", "outbox"),
         ("shards", "queue"), ("shards", "shard"), ("shards", "main"),
         ("shards", "batches")]

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
            [Extension("warren.gateway.amqp._hotpath", ["gateway/amqp/_hotpath.pyx"]),
             Extension("warren.shards._ring", ["shards/_ring.pyx"])],
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
        for package, module in TYPED:
            generated = f"{package}/{module}.c"
            if os.path.exists(generated) and os.path.getmtime(generated) < typing:
                os.remove(generated)
        typed = cythonize(
            [Extension(f"{package.replace('/', '.')}._{module}", [f"{package}/{module}.py"])
             for package, module in TYPED],
            compiler_directives={"language_level": 3, "annotation_typing": False},
            include_path=[include], nthreads=JOBS)
    for extension in typed:
        extension.name = "warren." + extension.name
    extensions += typed
    for extension in extensions:  # cythonize drops it: a failed build must not stop the install
        extension.optional = True

setup(ext_modules=extensions, options={"build_ext": {"parallel": JOBS}})
