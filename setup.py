"""The compiled twins of the hot paths: the codec's (gateway/amqp/_hotpath.pyx)
and the ring's core (shards/_ring.pyx). Everything else is in pyproject.toml.
Both are optional: without a C compiler the install goes on and the pure Python
twins serve."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("warren.gateway.amqp._hotpath", ["gateway/amqp/_hotpath.pyx"], optional=True),
     Extension("warren.shards._ring", ["shards/_ring.pyx"], optional=True)],
    compiler_directives={"language_level": 3}))
