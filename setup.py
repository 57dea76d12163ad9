"""The compiled part of loopwarden: the content layer's index (see proxy/detect/content.pyx)."""

from Cython.Build import cythonize
from setuptools import setup

setup(ext_modules=cythonize(["proxy/detect/content.pyx"], compiler_directives={"language_level": "3"}))
