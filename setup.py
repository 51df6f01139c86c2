"""The compiled twin of the hot-path codec (gateway/amqp/_hotpath.pyx). Everything
else is in pyproject.toml. The extension is optional: without a C compiler the
install goes on and the pure Python twin serves."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("warren.gateway.amqp._hotpath", ["gateway/amqp/_hotpath.pyx"], optional=True)],
    compiler_directives={"language_level": 3}))
