"""`contramine mine` and `contramine stage` send Prefect no flow-run heartbeats when its server is the temporary one
(no PREFECT_API_URL: nothing outlives the process to read them, and each flow run's exit waited up to 1 s on the
heartbeat thread's sleep); a configured server, or a user's own heartbeat setting, keeps them (flows/env.py).

What the flow engine reads is the setting (prefect.flow_engine: `heartbeat_seconds` is
`get_current_settings().flows.heartbeat_frequency`); the tests' processes replace that property (conftest), so
these tests read the setting where a mine's stage flows run: in a subflow called from a task on Prefect's threads."""
import pytest
from prefect import flow, task
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

from contramine.flows.env import HEARTBEAT_VARIABLES, heartbeats_where_read


@flow
def _stage_like_flow() -> int | None:
    return get_current_settings().flows.heartbeat_frequency


@task
def _stage_task() -> int | None:
    return _stage_like_flow()


@flow
def _mine_like_flow() -> tuple[int | None, int | None]:
    """The mine's shape: its own run, then a stage flow run from a task on the task runner's threads."""
    return get_current_settings().flows.heartbeat_frequency, _stage_task.submit().result()


@pytest.fixture
def no_user_setting(monkeypatch):
    for name in HEARTBEAT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("prefect_harness", "no_user_setting")
def test_no_heartbeats_to_the_temporary_server_in_any_flow_run_of_a_mine():
    # no API URL: Prefect's temporary server (under the harness, the harness' server stands in for it)
    with temporary_settings(updates={PREFECT_API_URL: None}):
        default = get_current_settings().flows.heartbeat_frequency
        with heartbeats_where_read():
            assert _mine_like_flow() == (None, None)
        assert get_current_settings().flows.heartbeat_frequency == default  # only inside
    assert default == 180  # Prefect's own default: heartbeats on


@pytest.mark.usefixtures("prefect_harness", "no_user_setting")
def test_a_configured_server_keeps_its_heartbeats():
    assert PREFECT_API_URL.value()  # the harness' server, as a user's configured one
    with heartbeats_where_read():
        assert _mine_like_flow() == (180, 180)


@pytest.mark.usefixtures("prefect_harness")
def test_a_users_own_heartbeat_setting_wins(monkeypatch):
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "45")
    with temporary_settings(updates={PREFECT_API_URL: None}), temporary_settings():  # re-read from the environment
        with heartbeats_where_read():
            assert get_current_settings().flows.heartbeat_frequency == 45
