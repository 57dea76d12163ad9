"""The request path's compiled modules: loaded only when built from the source beside them."""

import importlib
import os
import shutil
import sys

import pytest

from proxy import compiled

PURE = os.environ.get("LOOPWARDEN_NO_EXTENSIONS") == "1"
# In CI the build has a compiler: a module left uncompiled is a failure there, not a skip.
REQUIRED = os.environ.get("LOOPWARDEN_REQUIRE_COMPILED") == "1" and not PURE


def not_compiled(what: str) -> None:
    if REQUIRED:
        pytest.fail(f"{what} was not compiled by the install")
    pytest.skip("the request path is not compiled here (no C compiler or Cython at install)")


def built(name: str) -> str | None:
    """The compiled file of a module in this tree, if the install built it."""
    module = sys.modules.get(name) or importlib.import_module(name)
    folder = os.path.dirname(module.__file__)
    stem = name.rpartition(".")[2] + "."
    found = [f for f in os.listdir(folder) if f.startswith(stem) and f.endswith(".so")]
    return os.path.join(folder, found[0]) if found else None


def test_every_module_runs_compiled_when_built_or_as_python_when_told():
    for name in compiled.MODULES:
        importlib.import_module(name)
    files = {name: sys.modules[name].__file__ for name in compiled.MODULES}
    if PURE:
        assert all(path.endswith(".py") for path in files.values()), files
        assert compiled.describe() == "plain Python (LOOPWARDEN_NO_EXTENSIONS=1)"
    elif not all(path.endswith(".so") for path in files.values()):
        not_compiled(", ".join(name for name, path in files.items() if not path.endswith(".so")))
    else:
        assert compiled.describe() == f"compiled ({len(compiled.MODULES)} modules)"


def test_a_module_edited_since_its_build_runs_from_its_source(tmp_path):
    """A stale compiled module is never run: the finder gives the source, and says so."""
    so = built("proxy.lru")
    if so is None:
        not_compiled("proxy.lru")
    package = tmp_path / "proxy"
    package.mkdir()
    shutil.copy(so, package)
    shutil.copy(so + ".source", package)
    source = package / "lru.py"
    shutil.copy(os.path.join(os.path.dirname(so), "lru.py"), source)
    finder = compiled.FreshCompiled(enabled=True)

    spec = finder.find_spec("proxy.lru", [str(package)])
    assert spec.origin.endswith(".so") and finder.loaded["proxy.lru"] is True

    source.write_text(source.read_text() + "\n# edited\n")
    spec = finder.find_spec("proxy.lru", [str(package)])
    assert spec.origin == str(source) and finder.loaded["proxy.lru"] is False

    (package / (os.path.basename(so) + ".source")).unlink()  # built by an older install, without a digest
    source.write_text(source.read_text().removesuffix("\n# edited\n"))
    assert finder.find_spec("proxy.lru", [str(package)]).origin == str(source)

    assert compiled.FreshCompiled(enabled=False).find_spec("proxy.lru", [str(package)]).origin == str(source)
