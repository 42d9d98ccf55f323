"""Every module of the package imports first, on its own (an import cycle fails here).

One interpreter checks all modules: it imports no treadle module itself, only the
third-party libraries the package uses, and forks a child per module, so each child
imports its module first, with no treadle module loaded, as a fresh process would (the
libraries already loaded are the only difference, and no treadle module can hide there).
The treadle sources are compiled once in that parent (``compile`` is a pure function of
the source text; executing each module, where a cycle fails, still happens per child).
"""

from __future__ import annotations

import subprocess
import sys

_CHECK = r"""
import importlib, importlib.util, os, pkgutil, sys
from importlib.machinery import SourceFileLoader

def treadle_loaded():
    return sorted(m for m in sys.modules if m == "treadle" or m.startswith("treadle."))

def walk(path, prefix):  # pkgutil.walk_packages without importing the packages
    for info in pkgutil.iter_modules(path, prefix):
        yield info.name
        if info.ispkg:
            yield from walk([os.path.join(path[0], info.name.rsplit(".", 1)[1])], info.name + ".")

root = importlib.util.find_spec("treadle").submodule_search_locations
names = sorted(["treadle", *walk(list(root), "treadle.")])
names = [n for n in names if not n.endswith(".__main__")]  # running them is their job

compiled = {}  # (path, source) -> code, filled below before any fork
source_to_code = SourceFileLoader.source_to_code
def cached_source_to_code(self, data, path, *, _optimize=-1):
    key = (path, bytes(data))
    if key not in compiled or _optimize != -1:
        return source_to_code(self, data, path, _optimize=_optimize)
    return compiled[key]
SourceFileLoader.source_to_code = cached_source_to_code

def fork(job, arg):
    # run job(arg) in a forked child; returns (pid, read end of the pipe it answers on)
    sys.stdout.flush(); sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            answer = job(arg)
        except BaseException as e:  # noqa: BLE001 - reported by the parent
            answer = f"{arg}: {type(e).__name__}: {e}"[:4000]
        data = answer.encode()
        while data:
            data = data[os.write(w, data):]
        os._exit(0)
    os.close(w)
    return pid, r

def answer_of(pid, r, name):
    with os.fdopen(r, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if status != 0 and not text:
        text = f"{name}: the child ended with wait status {status}"
    return text

def third_party_of_all(_):  # what importing every module loads besides treadle
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - each child reports its own failure
            pass
    return "\n".join(m for m in sys.modules if not (m == "treadle" or m.startswith("treadle.")))

def import_first(name):
    assert not treadle_loaded(), treadle_loaded()
    importlib.import_module(name)
    return ""

# compile each source once, here; a syntax error is left to its child to report
for path in {os.path.join(dp, f) for p in root for dp, _, fs in os.walk(p) for f in fs}:
    if path.endswith(".py"):
        with open(path, "rb") as f:
            data = f.read()
        try:
            compiled[(path, data)] = compile(data, path, "exec", dont_inherit=True)
        except SyntaxError:
            pass

libraries = answer_of(*fork(third_party_of_all, "treadle"), "(all)").split("\n")
for lib in libraries:  # never a treadle module (checked below)
    if lib not in sys.modules and lib != "__main__":
        try:
            importlib.import_module(lib)
        except Exception:  # noqa: BLE001 - only a head start for the children
            pass
assert not treadle_loaded(), f"a library imported treadle: {treadle_loaded()}"

failed, running, pending = [], [], list(names)
while pending or running:
    while pending and len(running) < max(1, len(os.sched_getaffinity(0))):
        name = pending.pop(0)
        running.append((*fork(import_first, name), name))
    text = answer_of(*running.pop(0))
    if text:
        failed.append(text)
print(len(names))
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_first():
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[0]) > 40  # the walk found the package's modules
