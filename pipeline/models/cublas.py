"""CUDA 12's cuBLAS for CTranslate2, also where the machine's CUDA is 13 (the lent H100: torch cu130, no CUDA 12).

    where = load_cublas()     # "the loader path", the pip package's folder it came from, or None

CTranslate2's wheels (4.x: built against CUDA 12.8, CUDA_DYNAMIC_LOADING) open cuBLAS at first use with
dlopen("libcublas.so.12") (its src/cuda/cublas_stub.cc); the CUDA runtime is linked in, and a CUDA 13 driver runs
CUDA 12 code, so cuBLAS is all they lack there. The loader answers a dlopen by name from a library of that soname
already in the process before it searches any folder, so loading a copy first is enough:

1. the loader's own search (LD_LIBRARY_PATH, the ldconfig cache: a CUDA 12 toolkit), else
2. the pip package `nvidia-cublas-cu12`: <site-packages>/nvidia/cublas/lib/libcublas.so.12, with its
   libcublasLt.so.12 loaded first (cuBLAS needs it). LD_LIBRARY_PATH cannot point there from Python: the loader
   reads it when the process starts.

Each process that translates on CTranslate2 calls this before its first GPU translator (pipeline/models/translate/engines/ct2.py), and
the plan's probe calls it too (pipeline/models/translate/chains.py: ct2_cuda_problem).
"""
from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

CUBLAS = "libcublas.so.12"
CUBLAS_LT = "libcublasLt.so.12"
PIP_FOLDER = ("nvidia", "cublas", "lib")  # where nvidia-cublas-cu12 puts both, under a site-packages folder


def pip_cublas_folders(paths: Iterable[str] | None = None, library: str = CUBLAS) -> list[Path]:
    """The nvidia-cublas-cu12 folders on `paths` (default: sys.path) that hold `library`, in path order."""
    folders = (Path(p).joinpath(*PIP_FOLDER) for p in (sys.path if paths is None else paths) if p)
    return list(dict.fromkeys(f for f in folders if (f / library).is_file()))


def load_cublas(library: str = CUBLAS, paths: Iterable[str] | None = None,
                load: Callable[..., object] = ctypes.CDLL) -> str | None:
    """Load `library` into this process so that a later dlopen of its name finds it: "the loader path" when the
    loader finds it by itself, else the pip package folder it was loaded from (its cuBLASLt first), else None."""
    try:
        load(library, mode=ctypes.RTLD_GLOBAL)
        return "the loader path"
    except OSError:
        pass
    for folder in pip_cublas_folders(paths, library):
        try:
            if (folder / CUBLAS_LT).is_file():
                load(str(folder / CUBLAS_LT), mode=ctypes.RTLD_GLOBAL)
            load(str(folder / library), mode=ctypes.RTLD_GLOBAL)
            return str(folder)
        except OSError:
            continue  # e.g. a broken install: the next folder, else None
    return None
