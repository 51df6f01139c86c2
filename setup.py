"""The compiled twins of the hot paths: the codec's (gateway/amqp/_hotpath.pyx)
and the ring's core (shards/_ring.pyx). Everything else is in pyproject.toml.
Both are optional: without a C compiler (or, building without isolation,
without Cython) the install goes on and the pure Python twins serve."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # pyproject.toml asks for it; only a build without isolation lacks it
    extensions = []
else:
    extensions = cythonize(
        [Extension("warren.gateway.amqp._hotpath", ["gateway/amqp/_hotpath.pyx"], optional=True),
         Extension("warren.shards._ring", ["shards/_ring.pyx"], optional=True)],
        compiler_directives={"language_level": 3})

setup(ext_modules=extensions)
