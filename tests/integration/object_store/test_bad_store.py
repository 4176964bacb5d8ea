"""Bad object-store input fails at setup, clearly, with nothing written (issue 31).

Against the suite's real S3 server (SeaweedFS): an unknown bucket (which SeaweedFS would create on
a first write, so the check looks before it writes), wrong credentials, credentials that may read
but not write (the ``READER`` identity), an endpoint where nobody listens, and one that accepts
connections and never answers. Each is the setup check of ``check_writable`` (what setup and every
window run do before touching the source); the messages say what to fix and never hold the keys.
The connection itself (``object_store_conn_id``): unknown, of another type, and wrong keys through
a real window task, which fails before the source is read and saves no offset.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks import object_store, path_checks
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from tests.support.s3_server import ADMIN, BUCKET, READER

WRONG_SECRET = "wrong-secret-9d1e77f0c4"


def _refused(access, uri: str, name: str = "sink_path") -> str:
    with object_store.using(access), pytest.raises(CdcConfigurationError) as refused:
        check_writable(uri, name)
    message = str(refused.value)
    for secret in (ADMIN[1], READER[1], WRONG_SECRET):
        assert secret not in message
    return message


def _prefix_key(uri: str) -> str:
    return object_store.split_bucket(uri)[1]


def test_a_store_that_works_passes_and_keeps_nothing(s3_server, s3_prefix):
    check_writable(s3_prefix)
    check_writable(s3_prefix.replace("s3://", "s3a://"), "state_path")
    assert s3_server.keys(BUCKET, _prefix_key(s3_prefix)) == []  # the probe object is deleted


def test_an_unknown_bucket_is_refused_and_not_created(s3_server, s3_prefix):
    message = _refused(s3_server.access(), "s3://no-such-lake-31/cdc")
    assert "the bucket 'no-such-lake-31' does not exist" in message and "nothing was written" in message
    assert s3_server.endpoint_url in message
    names = [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]
    assert "no-such-lake-31" not in names


def test_wrong_credentials_are_refused_without_repeating_them(s3_server, s3_prefix):
    message = _refused(s3_server.access((ADMIN[0], WRONG_SECRET)), s3_prefix)
    assert "refused the credentials" in message and "object_store_conn_id" in message, message
    assert "nothing was written" in message
    message = _refused(s3_server.access(("no-such-key", WRONG_SECRET)), s3_prefix)
    assert "refused the credentials" in message, message


def test_credentials_that_cannot_write_are_refused_with_the_permissions_needed(s3_server, s3_prefix):
    message = _refused(s3_server.access(READER), s3_prefix, "state_path")
    assert message.startswith(f"state_path {s3_prefix!r}: writing failed"), message
    assert "s3:PutObject and s3:DeleteObject" in message and "list, get, put and delete" in message
    assert "nothing was written" in message
    assert s3_server.keys(BUCKET, _prefix_key(s3_prefix)) == []


def test_an_endpoint_nobody_listens_on_is_refused(s3_server, s3_prefix):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    message = _refused(replace(s3_server.access(), endpoint_url=endpoint), s3_prefix)
    assert f"the object store at {endpoint} did not answer" in message and "endpoint_url" in message, message


def test_an_endpoint_that_never_answers_is_bounded(s3_server, s3_prefix, monkeypatch):
    # Accepts connections and never answers: each request waits for object_store's request
    # timeout (and retries); setup's check gives up after its own bound (shortened here).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(path_checks, "SETUP_CHECK_TIMEOUT_SECONDS", 1.5)
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        message = _refused(replace(s3_server.access(), endpoint_url=endpoint), s3_prefix)
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        listener.close()
    assert f"the object store at {endpoint} did not answer within 1.5 s" in message, message
    assert accepted  # it was reached: the bound, not a refused connection, ended the check


def test_an_abandoned_check_never_changes_the_process_access(s3_server, s3_prefix, monkeypatch):
    # The check gives up on a store that never answers and leaves its probe thread running; when
    # that thread ends (long after the capture's own block), the process's access must be as it was.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    monkeypatch.setattr(path_checks, "SETUP_CHECK_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(object_store, "REQUEST_TIMEOUT_SECONDS", 1)
    monkeypatch.setattr(object_store, "MAX_RETRIES", 1)
    before = set(threading.enumerate())
    other = replace(s3_server.access(), endpoint_url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        _refused(other, s3_prefix)
    finally:
        listener.close()
    assert object_store.current() == s3_server.access()  # the fixture's, restored by the block
    for thread in set(threading.enumerate()) - before:
        thread.join(30)
        assert not thread.is_alive()
    assert object_store.current() == s3_server.access()


def test_a_store_that_ignores_conditional_writes_is_refused(s3_server, s3_prefix):
    # A store (or a proxy before it) that ignores If-None-Match: a second create of a name succeeds.
    from tests.support.s3_server import Forwarder

    ignoring = Forwarder(s3_server.endpoint_url, ignore_conditional_writes=True)
    try:
        message = _refused(replace(s3_server.access(), endpoint_url=ignoring.endpoint_url), s3_prefix)
    finally:
        ignoring.close()
    assert "does not honour conditional writes (If-None-Match)" in message, message
    assert "commit log publishes each entry with one create-only PUT" in message
    assert s3_server.keys(BUCKET, _prefix_key(s3_prefix)) == []


# -- the connection (object_store_conn_id) ------------------------------------------------------


def _aws_connection(s3_server, monkeypatch, conn_id: str, keys: tuple[str, str], **changes) -> None:
    connection = {"conn_type": "aws", "login": keys[0], "password": keys[1], "extra": s3_server.connection_extra()}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({**connection, **changes}))


def _capture(s3_prefix, conn_id: str, **overrides):
    from airflow_provider_cdc.captures.postgres import PostgresCapture

    settings = {
        "postgres_conn_id": "bad_store_db",
        "tables": ["public.orders"],
        "topic_prefix": "badstore",
        "sink_path": s3_prefix,
        "object_store_conn_id": conn_id,
    }
    return PostgresCapture(**{**settings, **overrides})


def test_the_connection_gives_the_access_and_an_unknown_one_is_refused(s3_server, s3_prefix, monkeypatch):
    _aws_connection(s3_server, monkeypatch, "lake_ok", ADMIN)
    access = _capture(s3_prefix, "lake_ok").object_store_access()
    assert access == s3_server.access()  # endpoint, region, path style and key id from the connection
    assert access.secret_access_key == ADMIN[1] and ADMIN[1] not in repr(access)
    with pytest.raises(CdcConfigurationError, match=r"'lake_missing' names no Airflow connection.*'aws' connection"):
        _capture(s3_prefix, "lake_missing").object_store_access()
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_PG", json.dumps({"conn_type": "postgres", "host": "db"}))
    with pytest.raises(CdcConfigurationError, match=r"'lake_pg' is a 'postgres' connection: give an 'aws'"):
        _capture(s3_prefix, "lake_pg").object_store_access()


def test_a_connection_without_keys_leaves_them_to_each_library_s_default_chain(s3_server, s3_prefix, monkeypatch):
    # No login/password, role or profile: the machine's credentials (here the environment's; on
    # AWS an instance or pod role, which the libraries refresh), never frozen into the access.
    _aws_connection(s3_server, monkeypatch, "lake_own_role", ("", ""))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ADMIN[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ADMIN[1])
    access = _capture(s3_prefix, "lake_own_role").object_store_access()
    assert access.access_key_id is None and access.secret_access_key is None
    assert access.endpoint_url == s3_server.endpoint_url
    with object_store.using(access):
        assert "AWS_ACCESS_KEY_ID" not in object_store.delta_storage_options(s3_prefix)
        check_writable(s3_prefix)  # Arrow and obstore found the keys themselves
    assert s3_server.keys(BUCKET, _prefix_key(s3_prefix)) == []


@pytest.mark.airflow
def test_wrong_keys_fail_the_window_task_before_the_source_is_read(s3_server, s3_prefix, airflow_db, monkeypatch):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.window import CdcWindowOperator
    from tests.support import airflow as af

    _aws_connection(s3_server, monkeypatch, "lake_wrong", (ADMIN[0], WRONG_SECRET))
    # No PostgreSQL connection exists: the task must fail on the store, before it opens the source.
    capture = _capture(s3_prefix, "lake_wrong")
    errors: dict = {}
    with DAG(
        "bad_store_window", schedule=None, default_args={"on_failure_callback": af.failure_recorder(errors)}
    ) as dag:
        CdcWindowOperator(task_id="capture_window", capture=capture)
    af.register(dag)
    result = af.run(dag, errors=errors)
    assert result.tasks["capture_window"] == "failed"
    message = result.error("capture_window")
    assert "refused the credentials" in message and "nothing was written" in message, message
    assert "bad_store_db" not in message  # the source was never asked for
    assert WRONG_SECRET not in message and ADMIN[1] not in message
    assert af.variable("cdc_offset__badstore") is None
    assert s3_server.keys(BUCKET, _prefix_key(s3_prefix)) == []
