"""The benches (not installed): peers/ (`make bench`, bench/run.py), gpu/ (`make gpu-check`), host/ (the host bench),
fixtures/ (models built in seconds), scale.py (`make scale`), mine_memory.py."""
