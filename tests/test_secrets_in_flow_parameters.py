"""A secret setting (runner.memo_key) given to a flow's parameters directly, not through the CLI, is refused in one
line that says where it belongs (the worker's environment), each way in: a call, a deployment, a deployment's run,
and a run of a deployment that does not enforce its parameters' schema. Neither Prefect's database nor the logs
hold the key after the first three; the last one's record is cleared of it (Prefect stored it before any code of
ours ran)."""
from __future__ import annotations

import logging
import uuid

import pytest

from contramine.flows.mine import STAGE_FLOWS, mine_flow
from contramine.pipeline.config import ConfigError

from test_memo_key_stays_out import KEY, _prefect_database_files

pytestmark = pytest.mark.usefixtures("prefect_harness")

SECRET = [f"runner.memo_key={KEY}"]
ADVICE = "set $CONTRAMINE_MEMO_KEY in the environment"


def _nowhere(caplog, capsys) -> None:
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    for path in _prefect_database_files():
        assert KEY.encode() not in path.read_bytes(), path
    out = capsys.readouterr()
    assert KEY not in out.out + out.err + caplog.text


def test_a_call_and_a_deployment_with_the_key_are_refused_and_prefect_never_holds_it(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    for call in (lambda: mine_flow(run="k", overrides=SECRET),
                 lambda: STAGE_FLOWS["sentences"].with_options(name="copy")("default", "k", None, SECRET),
                 lambda: mine_flow.to_deployment(name="k", parameters={"overrides": SECRET})):
        with pytest.raises(ConfigError) as refused:
            call()
        assert "runner.memo_key" in str(refused.value) and ADVICE in str(refused.value)
        assert KEY not in str(refused.value) and "\n" not in str(refused.value)
    _nowhere(caplog, capsys)


def test_a_deployment_run_with_the_key_is_refused_by_the_server(tmp_path, caplog, capsys):
    from prefect.deployments import run_deployment

    caplog.set_level(logging.DEBUG)
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    STAGE_FLOWS["sentences"].to_deployment(name=name).apply()
    with pytest.raises(Exception, match="CONTRAMINE_MEMO_KEY"):
        run_deployment(f"sentences/{name}", parameters={"overrides": SECRET}, timeout=0)
    _nowhere(caplog, capsys)


def test_a_run_of_a_deployment_without_its_schema_stops_in_one_line_and_its_record_forgets_the_key(caplog, capsys):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.flow_engine import run_flow

    caplog.set_level(logging.DEBUG)
    name = f"lax-{uuid.uuid4().hex[:8]}"
    flow = STAGE_FLOWS["sentences"]
    flow.to_deployment(name=name, enforce_parameter_schema=False).apply()
    run = run_deployment(f"sentences/{name}", parameters={"run": "k", "overrides": SECRET}, timeout=0)
    state = run_flow(flow, flow_run=run, parameters=run.parameters, return_type="state")  # as a worker runs it
    assert state.is_failed() and ADVICE in state.message and KEY not in state.message
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).parameters["overrides"] == []  # what the API and the UI show now
    out = capsys.readouterr()
    assert KEY not in out.out + out.err + caplog.text
