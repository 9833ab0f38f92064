"""Loaded at start-up by the Python processes the tests start (the suite puts this folder on their PYTHONPATH:
tests/conftest.py, TEST_PYTHONPATH): flow runs without Prefect's heartbeat thread, as in the test processes
(conftest.no_flow_heartbeats). Each flow run's exit waits for that thread's one-second sleep to end, ~0.9 s for a
short stage flow: ~13 s of a small CLI `mine` (14 flow runs) was waiting (measured here). The CLI's own code is
untouched; the patch is made when Prefect's flow engine is first imported, so a process that never runs a flow
imports nothing more. Test processes only: users' runs keep Prefect's heartbeats."""
import importlib.abc
import importlib.util
import sys


class _NoFlowHeartbeats(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "prefect.flow_engine":
            return None
        sys.meta_path.remove(self)  # once, and not for its own lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.BaseFlowRunEngine.heartbeat_seconds = property(lambda self: None)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoFlowHeartbeats())
