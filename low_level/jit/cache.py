"""Where Numba keeps lowwater's compiled machine code: a directory keyed by the sources.

Numba's on-disk cache checks only the file that defines a function. A kernel that calls or inlines
a function from another module, or reads a constant from one (the column indices in ``tables``, the
field numbers in ``contract.fields``), keeps running stale machine code after that other module
changes: wrong indices, wrong results, or a segfault, after any upgrade in place. So the cache lives
in a directory named by the hash of every source file the compiled code can depend on
(``low_level/`` and ``contract/``): a changed file means a fresh directory, never stale code.

Root: ``LOWWATER_JIT_CACHE``, else ``$XDG_CACHE_HOME/lowwater`` (``~/.cache/lowwater``), else a
private temporary directory when home is read-only. An explicit ``NUMBA_CACHE_DIR`` is respected as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_PACKAGES = ("low_level", "contract")
_configured: Path | None = None
_LOADED: dict[str, ModuleType] = {}


def sources_digest() -> str:
    """Hash of every .py file of the packages compiled code depends on (sorted, so deterministic)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / ".writable").touch()
        return True
    except OSError:
        return False


def directory() -> Path:
    """This source tree's cache directory (created on first use)."""
    global _configured
    if _configured is None:
        env = os.environ.get("LOWWATER_JIT_CACHE")
        base = (
            Path(env)
            if env
            else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lowwater"
        )
        d = base / f"jit-{sources_digest()}"
        if not _writable(d):  # read-only home (some containers)
            d = Path(tempfile.gettempdir()) / f"lowwater-{os.getuid()}" / f"jit-{sources_digest()}"
            d.mkdir(parents=True, exist_ok=True)
        _configured = d
    return _configured


def configure() -> None:
    """Point Numba's cache at :func:`directory` (before any ``cache=True`` function is defined)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    import numba

    numba.config.CACHE_DIR = str(directory() / "numba")


def load_generated(text: str, stem: str) -> ModuleType:
    """Import a generated module (kernels, filters) from this tree's cache, writing it on first use.

    The file name is the hash of the text, so Numba's cache of it (keyed by file) is reused by every
    later process with the same text, and a different text can never be mistaken for it. Generated
    text holds only integers from validated configs and code from lowwater's own templates.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"lowwater_{stem}_{digest}"
    if name in _LOADED:
        return _LOADED[name]
    d = directory() / "generated"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{stem}_{digest}.py"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: concurrent agents never import a half-written file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    _LOADED[name] = mod
    return mod
