"""The optional compiled part of loopwarden: the content layer's matcher (proxy/detect/_content.pyx).

Without a C compiler (or without Cython) the install still succeeds: `proxy.detect.content` then uses the
plain Python matcher, which gives the same verdicts more slowly.
"""

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython: the plain matcher only
    ext_modules = []
else:
    ext_modules = cythonize(["proxy/detect/_content.pyx"], compiler_directives={"language_level": "3"})
    for extension in ext_modules:
        extension.optional = True


class OptionalBuildExt(build_ext):
    """Build the extension when a compiler is at hand; say so on stderr and go on when not."""

    def run(self):
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 - no compiler is a supported install, whatever the error
            self._skipped(error)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001
            self._skipped(error)

    @staticmethod
    def _skipped(error):
        print(f"loopwarden: the compiled content matcher was not built ({error}); the plain Python one is used",
              file=sys.stderr)


setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
