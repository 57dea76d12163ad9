"""The optional compiled parts of loopwarden, built with Cython when a C compiler is at hand:

- the content layer's matcher (`proxy/detect/_content.pyx`);
- the scanner that finds a long body's list items (`proxy/wire/_items.pyx`), so a conversation's next request
  is parsed from where it differs from the one before;
- the request path's pure modules (`proxy/compiled.py` lists them), compiled as they are written: Cython reads
  plain Python, and the compiled module does what the source does at about half the CPU.

Without a compiler (or without Cython) the install still succeeds and the plain Python runs, giving the same
verdicts more slowly. Each compiled module is built beside a digest of the source it was built from
(`<module>.so.source`): a source edited since is run as Python until the next build (`proxy/compiled.py`).
"""

import hashlib
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy.compiled import MODULES, source_path  # noqa: E402 (the list the loader reads too)

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython: plain Python only
    ext_modules = []
else:
    ext_modules = cythonize(["proxy/detect/_content.pyx", "proxy/wire/_items.pyx"], compiler_directives={"language_level": "3"})
    if os.environ.get("LOOPWARDEN_NO_EXTENSIONS") != "1":
        # Type annotations stay annotations: the modules are compiled with Python's semantics, unchanged.
        # Named explicitly: a folder without __init__.py (proxy/server) would not give cythonize the full name.
        ext_modules += cythonize([Extension(name, [source_path(name)]) for name in MODULES],
                                 nthreads=os.cpu_count() or 1,
                                 compiler_directives={"language_level": "3", "annotation_typing": False,
                                                      "binding": True})
    for extension in ext_modules:
        extension.optional = True


class OptionalBuildExt(build_ext):
    """Build the extensions when a compiler is at hand; say so on stderr and go on when not."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:  # one compiler per core: the modules are independent
            self.parallel = os.cpu_count() or 1

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
            return
        if ext.name in MODULES:  # the digest of the source this module was built from, beside it
            with open(source_path(ext.name), "rb") as source:
                digest = hashlib.sha256(source.read()).hexdigest()
            with open(self.get_ext_fullpath(ext.name) + ".source", "w") as out:
                out.write(digest)

    def copy_extensions_to_source(self):  # an editable install: the digests go beside the copied modules too
        super().copy_extensions_to_source()
        for ext in self.extensions:
            built = os.path.join(self.build_lib, self.get_ext_filename(ext.name)) + ".source"
            if ext.name in MODULES and os.path.exists(built):
                self.copy_file(built, os.path.join(os.path.dirname(source_path(ext.name)), os.path.basename(built)))

    @staticmethod
    def _skipped(error):
        print(f"loopwarden: a compiled module was not built ({error}); its plain Python is used",
              file=sys.stderr)


setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
