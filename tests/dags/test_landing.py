"""Data arrival: demo partitions, landing as a transaction (a local directory and S3 over
HTTP), the producer DAG ``land_labelled_data`` and the asset event that triggers
``keras_retrain`` (its timetable, and the scheduler's own asset-triggered run creation)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from training.data.sources import landing
from training.errors import ConfigError, DatasetError, StorageError

LABELLED_URI = "x-training://data/labelled"
DAYS = ("dt=2026-11-28", "dt=2026-11-29", "dt=2026-11-30")


@pytest.fixture(scope="module")
def incoming(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The default demo: three days, the third drifted."""
    from training.data.sources.demo import write_demo_partitions

    out = tmp_path_factory.mktemp("incoming")
    return out, write_demo_partitions(out)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _pixels(partition: Path) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(io.BytesIO(data)))
                     for data in _files(partition).values()])


def _high_labels(partition: Path) -> float:
    labels = [int(path.split("/")[0]) for path in _files(partition)]
    return sum(label >= 5 for label in labels) / len(labels)


# --- demo partitions -------------------------------------------------------------------

def test_demo_partitions_are_deterministic_and_drift_on_the_drift_day(incoming, tmp_path):
    from training.data.sources.demo import write_demo_partitions

    out, result = incoming
    assert [p["partition"] for p in result["partitions"]] == list(DAYS)
    assert sorted(p.name for p in out.iterdir()) == list(DAYS)  # nothing half-written left
    again = write_demo_partitions(tmp_path / "again")
    assert _files(tmp_path / "again") == _files(out)  # the same bytes
    assert again["partitions"] == result["partitions"]
    normal = [p for p in result["partitions"] if not p["drifted"]]
    assert sum(p["files"] for p in normal) == 2 * 599  # 1,797 images over three days
    assert [p["drifted"] for p in result["partitions"]] == [False, False, True]
    # Every file is <label>/<n>.png, an 8x8 grayscale PNG of that label's digit.
    first = _files(out / DAYS[0])
    assert len(first) == 599 and all(len(k.split("/")) == 2 for k in first)
    assert _pixels(out / DAYS[0]).shape == (599, 8, 8)

    # The drift day is inverted (the mean pixel jumps) and skewed towards labels 0-4.
    means = [float(_pixels(out / day).mean()) for day in DAYS]
    assert means[0] < 100 and means[1] < 100 and means[2] > 150, means
    mixes = [_high_labels(out / day) for day in DAYS]
    assert 0.4 < mixes[0] < 0.6 and 0.4 < mixes[1] < 0.6 and mixes[2] < 0.2, mixes


def test_demo_skip_day_writes_no_partition_and_bad_arguments_are_refused(tmp_path):
    from training.data.sources.demo import write_demo_partitions

    result = write_demo_partitions(tmp_path, days=4, drift_day=4, skip_day=3)
    assert result["skipped"] == ["dt=2026-11-30"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dt=2026-11-28", "dt=2026-11-29", "dt=2026-12-01"]
    assert sum(p["files"] for p in result["partitions"] if not p["drifted"]) == 1198
    for kwargs, message in [
        ({"start": "28.11.2026"}, "start must be a date YYYY-MM-DD, got '28.11.2026'"),
        ({"days": 0}, "days must be between 1 and 366, got 0"),
        ({"drift_day": 4}, "drift_day must be a day between 1 and days=3 (or 0 for none), got 4"),
        ({"skip_day": 3}, "skip_day must leave a day with data and differ from drift_day"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            write_demo_partitions(tmp_path / "bad", **kwargs)


# --- landing ---------------------------------------------------------------------------

class Recording:
    """A store that records its writes and can fail the n-th one."""

    def __init__(self, store, fail_at: int | None = None):
        self.store, self.fail_at, self.puts = store, fail_at, []
        self.uri = store.uri

    def put_bytes(self, key, data, **conditions):
        if self.fail_at is not None and len(self.puts) == self.fail_at:
            raise StorageError(f"injected failure writing {key!r}")
        self.puts.append(key)
        return self.store.put_bytes(key, data, **conditions)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.fixture(params=["file", "s3"])
def data_uri(request, tmp_path, s3_server) -> tuple[str, object]:
    """A data store (a local directory, or a bucket over HTTP) and its S3Options."""
    if request.param == "file":
        return os.fspath(tmp_path / "labelled"), None
    return f"s3://{s3_server.create_bucket()}/team/labelled", s3_server.options()


SOURCE_FILES = 61  # one in six of the drift day's 366: enough, and quick over HTTP


@pytest.fixture
def source(incoming, tmp_path) -> Path:
    """Some of the drift day's files, under a day of their own."""
    out, _ = incoming
    target = tmp_path / "source" / "dt=2026-12-05"
    target.mkdir(parents=True)
    for path, data in list(_files(out / DAYS[2]).items())[::6]:
        (target / path).parent.mkdir(exist_ok=True)
        (target / path).write_bytes(data)
    return target.parent


def _recording(monkeypatch, fail_at: int | None = None) -> list[Recording]:
    import training.registry

    opened, real = [], training.registry.open_store

    def open_store(uri, options=None):
        opened.append(Recording(real(uri, options), fail_at))
        return opened[-1]

    monkeypatch.setattr(training.registry, "open_store", open_store)
    return opened


def test_land_copies_every_file_writes_success_last_and_repeats_as_a_no_op(
        data_uri, source, monkeypatch):
    from training.registry import open_store

    uri, options = data_uri
    partition = "dt=2026-12-05"
    expected = _files(source / partition)
    opened = _recording(monkeypatch)
    result = landing.land(source, uri, partition, store_options=options)
    assert result == {"partition": partition, "data_uri": uri, "files": len(expected),
                      "bytes": sum(map(len, expected.values())),
                      "sha256": result["sha256"], "landed": True}
    puts = opened[0].puts
    assert puts[0] == f"{partition}/_LANDING" and puts[-1] == f"{partition}/_SUCCESS"
    assert sorted(puts[1:-1]) == sorted(f"{partition}/{path}" for path in expected)

    store = open_store(uri, options)
    assert {key: store.get_bytes(key) for key in store.list(f"{partition}/")
            if not key.endswith(("_SUCCESS", "_LANDING"))} == {
        f"{partition}/{path}": data for path, data in expected.items()}
    marker = landing.read_marker(store, partition)
    pairs = sorted((path, hashlib.sha256(data).hexdigest()) for path, data in expected.items())
    assert marker["sha256"] == hashlib.sha256(json.dumps(pairs).encode()).hexdigest()
    assert marker["sha256"] == result["sha256"] and marker["state"] == "complete"
    assert (marker["files"], marker["bytes"]) == (result["files"], result["bytes"])
    assert [e["path"] for e in marker["entries"]] == sorted(expected)

    again = landing.land(source, uri, partition, store_options=options)
    assert again == {**result, "landed": False}
    assert opened[1].puts == []  # nothing written


def test_land_refuses_other_content_unless_replace(data_uri, source):
    from training.registry import open_store

    uri, options = data_uri
    partition = "dt=2026-12-05"
    first = landing.land(source, uri, partition, store_options=options)
    changed = source / partition / "0" / "extra.png"
    changed.write_bytes(b"not the same content")
    with pytest.raises(DatasetError, match=(
            rf"partition {partition} in .* already landed with other content "
            rf"\({first['files']} files, sha256 {first['sha256'][:16]}\); got "
            rf"{first['files'] + 1} files, .* replace it \(replace=True, --replace\)")):
        landing.land(source, uri, partition, store_options=options)
    store = open_store(uri, options)
    assert landing.read_marker(store, partition)["sha256"] == first["sha256"]
    assert not store.exists(f"{partition}/0/extra.png")  # refused before writing anything

    replaced = landing.land(source, uri, partition, store_options=options, replace=True)
    assert replaced["landed"] and replaced["files"] == first["files"] + 1
    assert landing.read_marker(store, partition)["sha256"] == replaced["sha256"]
    assert store.get_bytes(f"{partition}/0/extra.png") == b"not the same content"


def test_a_landing_cut_short_leaves_no_success_and_a_retry_finishes_it(tmp_path, source,
                                                                       monkeypatch):
    from training.registry import open_store

    uri, partition = os.fspath(tmp_path / "labelled"), "dt=2026-12-05"
    _recording(monkeypatch, fail_at=20)
    with pytest.raises(StorageError, match="injected failure"):
        landing.land(source, uri, partition)
    store = open_store(uri)
    assert not store.exists(f"{partition}/_SUCCESS")
    assert landing.read_marker(store, partition) is None
    monkeypatch.undo()
    # Other content is refused while the claim stands; the same content finishes it.
    other = tmp_path / "other" / partition / "1"
    other.mkdir(parents=True)
    (other / "a.png").write_bytes(b"other")
    with pytest.raises(DatasetError, match=f"partition {partition} in .* is being landed with "
                                           "other content .* if that landing was cut short"):
        landing.land(tmp_path / "other", uri, partition)
    assert landing.land(source, uri, partition)["landed"] is True
    assert landing.read_marker(store, partition)["files"] == SOURCE_FILES


@pytest.mark.parametrize("partition", [
    "2026-11-28", "dt=2026-13-01", "dt=2026-1-01", "dt=2026-11-28/..", "dt=26-11-28", "",
    "dt=２０２６-11-28", None])
def test_a_bad_partition_name_is_refused_naming_it(partition, tmp_path):
    message = "partition must be dt=YYYY-MM-DD with a real date, like dt=2026-11-28, got "
    with pytest.raises(ConfigError) as raised:
        landing.land(tmp_path, os.fspath(tmp_path / "store"), partition)
    assert str(raised.value) == message + repr(partition)
    assert not (tmp_path / "store").exists()


def test_the_source_must_be_label_slash_file(tmp_path):
    (tmp_path / "dt=2026-11-28").mkdir()
    with pytest.raises(DatasetError, match="holds no files"):
        landing.land(tmp_path, os.fspath(tmp_path / "store"), "dt=2026-11-28")
    (tmp_path / "dt=2026-11-28" / "stray.png").write_bytes(b"x")
    with pytest.raises(DatasetError, match="must be <label>/<image file> .* got 'stray.png'"):
        landing.land(tmp_path, os.fspath(tmp_path / "store"), "dt=2026-11-28")
    with pytest.raises(DatasetError, match="no partition directory .*dt=2026-11-29"):
        landing.land(tmp_path, os.fspath(tmp_path / "store"), "dt=2026-11-29")


def test_the_command_line_lands_and_fails_in_one_line(source, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "training.data.sources.landing", *args],
                              capture_output=True, text=True, timeout=120)

    store = os.fspath(tmp_path / "labelled")
    done = run("land", "--from", os.fspath(source), "--partition", "dt=2026-12-05",
               "--to", store)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["files"] == SOURCE_FILES
    bad = run("land", "--from", os.fspath(source), "--partition", "dt=2026-02-30", "--to", store)
    assert bad.returncode == 2  # a bad configuration: no retry fixes it
    assert bad.stderr.strip().splitlines() == [
        "error: partition must be dt=YYYY-MM-DD with a real date, like dt=2026-11-28, got "
        "'dt=2026-02-30'"]


# --- the producer DAG and the trigger --------------------------------------------------

@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


def test_the_producer_dag_parses_and_declares_the_asset(dagbag):
    assert dagbag.import_errors == {}
    dag = dagbag.dags["land_labelled_data"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # manual, or over the REST API
    assert [t.task_id for t in dag.tasks] == ["land"]
    assert [(o.name, o.uri) for o in dag.get_task("land").outlets] == [
        ("labelled_data", LABELLED_URI)]
    assert set(dag.params) == {"partition", "source_dir", "data_uri"}


def test_the_task_lands_the_day_before_the_run_by_default_and_fails_bad_input_at_once(
        dagbag, source, tmp_path):
    import pendulum
    from airflow.sdk.exceptions import AirflowFailException

    land = dagbag.dags["land_labelled_data"].get_task("land").python_callable
    events = defaultdict(SimpleNamespace)
    params = {"partition": None, "source_dir": os.fspath(source),
              "data_uri": os.fspath(tmp_path / "labelled")}
    run = SimpleNamespace(run_after=pendulum.datetime(2026, 12, 6, 0, 30, tz="UTC"))
    result = land(params=params, dag_run=run, outlet_events=events)
    assert result["partition"] == "dt=2026-12-05" and result["files"] == SOURCE_FILES
    (extra,) = [e.extra for e in events.values()]
    assert extra == {"partition": "dt=2026-12-05", "files": SOURCE_FILES,
                     "data_uri": params["data_uri"]}
    with pytest.raises(AirflowFailException, match="partition must be dt=YYYY-MM-DD .* got 'x'"):
        land(params={**params, "partition": "x"}, dag_run=run, outlet_events=events)


def test_keras_retrain_runs_on_its_cron_or_on_labelled_data(dagbag):
    from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable

    timetable = dagbag.dags["keras_retrain"].timetable
    assert isinstance(timetable, AssetOrTimeSchedule)
    assert isinstance(timetable.timetable, CronTriggerTimetable)
    assert timetable.timetable.expression == "0 3 * * *"
    assert timetable.asset_condition == Asset(name="labelled_data", uri=LABELLED_URI)


def test_without_a_cron_keras_retrain_runs_on_labelled_data_only(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Asset

    monkeypatch.setenv("TRAINING_SCHEDULE", "")  # read when the file is parsed
    dag_file = os.path.join(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], "keras_retrain.py")
    timetable = DagBag(dag_file).dags["keras_retrain"].timetable
    assert type(timetable).__name__ == "AssetTriggeredTimetable"
    assert timetable.asset_condition == Asset(name="labelled_data", uri=LABELLED_URI)


def _sync_and_unpause(*dag_ids: str) -> None:
    """Both DAGs in the metadata DB as the dag-processor writes them, unpaused."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path,
                                    bundle_name=bundle.name), bundle.name, bundle.version)
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids))
                        .values(is_paused=False))


def _create_dagruns_as_the_scheduler_does() -> None:
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    runner = SchedulerJobRunner(job=Job(), num_runs=1)
    with create_session() as session, prohibit_commit(session) as guard:
        runner._create_dagruns_for_dags(guard, session)


@pytest.mark.slow
def test_landing_records_an_asset_event_that_triggers_keras_retrain(
        airflow_db, dagbag, s3_server, source, monkeypatch):
    from airflow.models import DagRun
    from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete, update

    from training.registry import open_store
    from training_airflow.params import run_day

    bucket = s3_server.create_bucket()
    uri = f"s3://{bucket}/team/labelled"
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(s3_server.connection()))
    _sync_and_unpause("keras_retrain", "land_labelled_data")
    try:
        run = dagbag.dags["land_labelled_data"].test(run_conf={
            "source_dir": os.fspath(source), "partition": "dt=2026-12-05", "data_uri": uri})
        assert str(run.state) == "success"
        store = open_store(uri, s3_server.options())
        assert landing.read_marker(store, "dt=2026-12-05")["files"] == SOURCE_FILES

        with create_session() as session:
            events = session.query(AssetEvent).join(
                AssetModel, AssetEvent.asset_id == AssetModel.id).filter(
                AssetModel.uri == LABELLED_URI, AssetEvent.source_run_id == run.run_id).all()
            assert [e.extra for e in events] == [
                {"partition": "dt=2026-12-05", "files": SOURCE_FILES, "data_uri": uri}]
            event_id = events[0].id
            queued = session.query(AssetDagRunQueue).filter(
                AssetDagRunQueue.target_dag_id == "keras_retrain").count()
            assert queued == 1

        # The scheduler's own step turns the queued event into a keras_retrain run.
        _create_dagruns_as_the_scheduler_does()
        with create_session() as session:
            runs = session.query(DagRun).filter(DagRun.dag_id == "keras_retrain",
                                                DagRun.run_type == "asset_triggered").all()
            assert len(runs) == 1 and str(runs[0].state) == "queued"
            assert [e.id for e in runs[0].consumed_asset_events] == [event_id]
            assert runs[0].consumed_asset_events[0].extra["partition"] == "dt=2026-12-05"
            triggered = runs[0].run_id
            # The run stages up to the day the event landed, not the day before it runs:
            # what its tasks see, from the real events.
            context = {"triggering_asset_events": {LABELLED_URI: runs[0].consumed_asset_events},
                       "data_interval_end": runs[0].data_interval_end, "dag_run": runs[0]}
            assert run_day(context) == "2026-12-05"
            del context["triggering_asset_events"]
            end = runs[0].data_interval_end or runs[0].run_after
            assert run_day(context) == (end.date() - timedelta(days=1)).isoformat()
    finally:
        with create_session() as session:  # leave the session's DB as the other tests expect
            session.execute(delete(DagRun).where(DagRun.dag_id == "keras_retrain",
                                                 DagRun.run_type == "asset_triggered"))
            session.execute(delete(AssetDagRunQueue))
            session.execute(update(DagModel).values(is_paused=True))
    assert triggered.startswith("asset_triggered__")
