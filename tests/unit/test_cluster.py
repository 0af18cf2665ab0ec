"""TF_CONFIG, built and read in one place (``training.train.cluster``)."""

import json

import pytest

from training.errors import ConfigError
from training.train import cluster


def test_build_names_every_worker_and_the_task_index():
    hosts = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    configs = [cluster.build(hosts, i) for i in range(3)]
    for i, raw in enumerate(configs):
        assert json.loads(raw) == {"cluster": {"worker": hosts},
                                   "task": {"type": "worker", "index": i}}
        assert cluster.workers(raw) == 3
        assert cluster.task_index(raw) == i
        assert cluster.is_chief(raw) is (i == 0)
    assert configs[1] == cluster.build(list(hosts), 1)  # the same text for the same input


@pytest.mark.parametrize(("hosts", "index", "message"), [
    (["a:1", "b:1", "c:1"], 3, "worker index must be between 0 and 2 for 3 workers, got 3"),
    (["a:1"], -1, "worker index must be between 0 and 0 for 1 workers, got -1"),
    (["a:1", "b:1"], True, "got True"),
    ([], 0, r"hosts must be a non-empty list of 'host:port', got \[\]"),
])
def test_build_refuses_what_cannot_be_a_cluster(hosts, index, message):
    with pytest.raises(ConfigError, match=message):
        cluster.build(hosts, index)


def test_workers_counts_chief_and_workers():
    assert cluster.workers(None) == 0 and cluster.workers("") == 0
    cfg = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "chief"}}
    assert cluster.workers(json.dumps(cfg)) == 3
    for bad in ("{nope", "[1, 2]", '{"cluster": 3}'):
        with pytest.raises(ConfigError, match="TF_CONFIG must be a JSON object with a "
                                              "cluster, got"):
            cluster.workers(bad)


def test_is_chief():
    assert cluster.is_chief(None)
    two = {"cluster": {"worker": ["a:1", "b:1"]}}
    assert cluster.is_chief(json.dumps({**two, "task": {"type": "worker", "index": 0}}))
    assert not cluster.is_chief(json.dumps({**two, "task": {"type": "worker", "index": 1}}))
    with_chief = {"cluster": {"chief": ["c:1"], "worker": ["a:1"]}}
    assert not cluster.is_chief(json.dumps({**with_chief,
                                            "task": {"type": "worker", "index": 0}}))
    assert cluster.is_chief(json.dumps({**with_chief, "task": {"type": "chief", "index": 0}}))


def test_current_reads_the_environment(monkeypatch):
    assert cluster.current({}) is None
    assert cluster.current({"TF_CONFIG": ""}) is None
    assert cluster.current({"TF_CONFIG": "{}"}) == "{}"
    monkeypatch.setenv("TF_CONFIG", cluster.build(["a:1", "b:1"], 1))
    assert cluster.task_index(cluster.current()) == 1
    monkeypatch.delenv("TF_CONFIG")
    assert cluster.current() is None
