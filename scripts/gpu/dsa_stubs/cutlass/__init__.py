"""Import-only stand-in for NVIDIA's CuTe-DSL package (``nvidia-cutlass-dsl``, imported as ``cutlass``).

Why it exists: SGLang 0.5.15 imports ``cutlass`` at module level on the DSA path (deepseek_v2 -> dsa_indexer ->
sglang/jit_kernel/dsa/cutedsl_paged_mqa_logits.py, a Blackwell-only CuTe-DSL kernel). Without it the
``DeepseekV32ForCausalLM`` class is not registered at all. On Hopper (SM90) that kernel is never called (the
indexer's paged MQA logits go to DeepGEMM), so surviving the import is all that is needed, and the package is
too big to carry to the lent H200. scripts/gpu/dsa_suite.sh puts this folder on the server's PYTHONPATH only when
the real ``cutlass`` does not import there, and then also sets FLASHINFER_USE_CUDA_NORM=1 (flashinfer would
otherwise pick its CuTe-DSL RMSNorm, built from these stand-ins, and crash at the first forward).

Every attribute, submodule, call or subscript gives another stand-in; a bare decorator returns what it decorates,
so module-level ``@cute.jit`` functions and classes are defined. Any real use computes nothing meaningful: a run
that used this kernel would crash or fail its checks, never pass silently.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+llmserve-import-stub"


class _Stand:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Stand(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            return args[0]  # a bare decorator keeps what it decorates
        return _Stand(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return _Stand(f"{self._name}[]")

    def __mro_entries__(self, bases: Any) -> tuple[type, ...]:
        return (object,)  # class X(cutlass.Something): ...

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<cutlass import stub {self._name}>"

    def _same(self, *args: Any) -> Any:
        return self  # module-level annotations and constants (`cutlass.Int32 | None`, `BLOCK * 2`)

    __or__ = __ror__ = __and__ = __rand__ = __add__ = __radd__ = __sub__ = __rsub__ = _same
    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _same
    __pow__ = __neg__ = __lshift__ = __rshift__ = _same


class _StandModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Stand(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``cutlass.*`` submodule as a stand-in package."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Finder())


def __getattr__(attr: str) -> Any:
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    return _Stand(f"{__name__}.{attr}")
