"""Which GPU a process uses. On one machine with several GPUs and a Dask cluster of one worker per GPU, worker w
takes device w mod n_gpus (the encoder, the translator and the FAISS index alike); outside a Dask worker a
process uses device 0 for models and every GPU for FAISS (`index_cpu_to_all_gpus`)."""
from __future__ import annotations


def worker_index() -> int | None:
    """This Dask worker's number (LocalCluster names workers 0, 1, ...; other names hash stably), else None."""
    try:
        from distributed import get_worker

        name = get_worker().name
    except (ImportError, ValueError):  # not inside a Dask worker
        return None
    if isinstance(name, int) or (isinstance(name, str) and name.isdigit()):
        return int(name)
    import zlib

    return zlib.crc32(str(name).encode())


def worker_gpu(n_gpus: int) -> int | None:
    """The GPU this Dask worker owns (None outside a worker or without GPUs)."""
    w = worker_index()
    return None if w is None or n_gpus <= 0 else w % n_gpus
