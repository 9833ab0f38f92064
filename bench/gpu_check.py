"""`python -m bench.gpu_check`: the name the GPU check had before bench/ became packages (DEVELOPERS.md's prepared
command uses it); the check itself is bench/gpu/check.py (`python -m bench.gpu.check`)."""
from bench.gpu.check import main

if __name__ == "__main__":
    raise SystemExit(main())
