"""The input pipeline's stages (training.data.input): the memory-fit cache and the
seeded, parallel augmentation, on the staged digits."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from training.config import DatasetConfig
from training.data.input.choose import decoded_bytes, load_builder, make_dataset
from training.data.input.memory import available_memory, cache_plan
from training.data.snapshot import staging
from training.errors import ConfigError


def _epochs(ds, count=2):
    """Every epoch's images and labels, each a fresh iterator as Keras makes them."""
    out = []
    for _ in range(count):
        batches = list(ds)
        out.append((np.concatenate([b[0].numpy() for b in batches]),
                    np.concatenate([b[1].numpy() for b in batches])))
    return out


def test_auto_caches_a_split_that_fits_in_a_quarter_of_memory_and_says_why():
    assert cache_plan("auto", 100, 400)[0] is True
    assert cache_plan("auto", 101, 400)[0] is False
    fits, why = cache_plan("auto", 100 * 2**20, 400 * 2**20)
    assert fits and "100.0 MB decoded fits in 100.0 MB" in why
    fits, why = cache_plan("auto", 101 * 2**20, 400 * 2**20)
    assert not fits and "exceeds" in why and "decoded again every epoch" in why
    assert cache_plan("memory", 10**15, 1)[0] is True
    assert cache_plan("none", 1, 10**15)[0] is False
    assert cache_plan("auto", None, 10**9)[0] is True  # no size in the info: as before


def test_the_decoded_size_comes_from_the_dataset_info(staged_digits):
    builder = load_builder(staged_digits)
    assert decoded_bytes(builder, "train") == 1258 * (8 * 8 * 1 + 8)
    assert decoded_bytes(builder, "train[:90%]") == builder.info.splits[
        "train[:90%]"].num_examples * 72


def _host(tmp_path, cgroup_line="0::/pod/app", **files):
    """A fake /proc and /sys under tmp_path: 8 GiB available, the process in
    ``cgroup_line``'s cgroup, and ``files`` (paths under sys/fs/cgroup) written."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal: 16777216 kB\n"
                                           "MemAvailable: 8388608 kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup_line + "\n")
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


GIB = 2**30


@pytest.mark.parametrize(("files", "expected"), [
    ({}, 8 * GIB),  # no cgroup files: MemAvailable
    # v2, the process's own cgroup: 2 GiB limit, 1.5 GiB used of which 0.5 GiB is
    # inactive page cache -> 1 GiB left
    ({"pod__app__memory.max": str(2 * GIB), "pod__app__memory.current": str(3 * GIB // 2),
      "pod__app__memory.stat": f"anon 1\ninactive_file {GIB // 2}\n"}, GIB),
    ({"pod__app__memory.max": "max", "pod__app__memory.current": "5",
      "pod__app__memory.stat": ""}, 8 * GIB),  # v2 without a limit
    # v1: 4 GiB limit, 3.5 GiB used, 1 GiB of it inactive cache -> 1.5 GiB
    ({"memory__memory.limit_in_bytes": str(4 * GIB),
      "memory__memory.usage_in_bytes": str(7 * GIB // 2),
      "memory__memory.stat": f"total_inactive_file {GIB}\n"}, 3 * GIB // 2),
    ({"memory__memory.limit_in_bytes": "9223372036854771712",  # v1 without a limit
      "memory__memory.usage_in_bytes": "1", "memory__memory.stat": ""}, 8 * GIB),
    ({"pod__app__memory.max": str(GIB), "pod__app__memory.current": str(2 * GIB),
      "pod__app__memory.stat": "inactive_file 0\n"}, 0),  # over its limit: nothing
])
def test_available_memory_is_what_the_cgroup_limit_leaves_when_lower(tmp_path, files,
                                                                     expected):
    assert available_memory(_host(tmp_path, **files)) == expected


def test_available_memory_on_this_machine_is_at_most_its_memory():
    meminfo = Path("/proc/meminfo").read_text()
    total = int(next(line for line in meminfo.splitlines()
                     if line.startswith("MemTotal:")).split()[1]) * 1024
    memory = available_memory()
    assert memory is not None and 0 < memory <= total


def test_a_cached_split_is_read_once_and_an_uncached_one_every_epoch(staging_dir, tmp_path):
    """The memory cache holds the decoded split: with the shard files gone a cached
    pipeline still gives every example, an uncached one has to read them again."""
    own = tmp_path / "staging"
    shutil.copytree(staging_dir, own)
    builder = load_builder(staging.stage(DatasetConfig(staging_dir=str(own))))
    kept = make_dataset(builder, "validation", global_batch_size=64, shuffle=False, seed=0,
                        cache="memory")
    streamed = make_dataset(builder, "validation", global_batch_size=64, shuffle=False,
                            seed=0, cache="none")
    (first, labels), = _epochs(streamed, 1)
    assert first.shape == (180, 8, 8, 1)
    for shard in Path(builder.data_dir).glob("*.tfrecord*"):
        shard.unlink()
    (again, again_labels), = _epochs(kept, 1)
    assert np.array_equal(again, first) and np.array_equal(again_labels, labels)
    with pytest.raises(Exception, match="(?i)not found|no such file"):
        _epochs(streamed, 1)


def test_augmentation_is_seeded_drawn_anew_each_epoch_and_keeps_order(staged_digits):
    """Repeatable for a seed with and without the cache (the parallel map keeps order)."""
    builder = load_builder(staged_digits)

    def pipeline(augment, seed=3, cache="memory"):
        return make_dataset(builder, "train", global_batch_size=100, shuffle=True,
                            seed=seed, augment=augment, cache=cache)

    plain = _epochs(pipeline("none"))
    flipped = _epochs(pipeline("flip"))
    for (images, labels), (changed, changed_labels) in zip(plain, flipped, strict=True):
        assert np.array_equal(labels, changed_labels)  # after the shuffle: same order
        same = np.all(changed == images, axis=(1, 2, 3))
        mirrored = np.all(changed == images[:, :, ::-1, :], axis=(1, 2, 3))
        assert np.all(same | mirrored)
        symmetric = np.all(images == images[:, :, ::-1, :], axis=(1, 2, 3))
        assert 0.3 < np.mean(mirrored & ~symmetric) < 0.7  # about half flipped
    assert not np.array_equal(flipped[0][0], flipped[1][0])  # new draws each epoch
    # Repeatable for a seed with or without the cache; another seed differs.
    again = _epochs(pipeline("flip_crop", cache="none"))
    for (a, la), (b, lb) in zip(_epochs(pipeline("flip_crop")), again, strict=True):
        assert np.array_equal(a, b) and np.array_equal(la, lb)
    other = _epochs(pipeline("flip_crop", seed=4), 1)[0][0]
    assert not np.array_equal(other, again[0][0])


def test_a_crop_moves_the_image_within_its_padding(staged_digits):
    builder = load_builder(staged_digits)
    plain = make_dataset(builder, "validation", global_batch_size=180, shuffle=False,
                         seed=0, augment="none")
    cropped = make_dataset(builder, "validation", global_batch_size=180, shuffle=False,
                           seed=0, augment="crop")
    assert cropped.element_spec[0].shape.as_list() == [None, 8, 8, 1]
    (images, _), = _epochs(plain, 1)
    (moved, _), = _epochs(cropped, 1)
    assert moved.dtype == np.uint8
    unchanged = np.all(moved == images, axis=(1, 2, 3))
    assert 0 < unchanged.sum() < len(images)  # 1 in 9 offsets (pad 1 of 8) is none
    # An 8x8 image padded by 1 (reflected) and cropped back: the inner 6x6 of the
    # original is in every crop, shifted by at most one pixel.
    for image, crop in zip(images, moved, strict=True):
        assert any(np.array_equal(image[1:7, 1:7], crop[1 + dy:7 + dy, 1 + dx:7 + dx])
                   for dy in (-1, 0, 1) for dx in (-1, 0, 1))


@pytest.mark.parametrize(("field", "value"), [("input_cache", "disk"), ("augment", "rotate")])
def test_a_bad_pipeline_setting_names_the_field_the_value_and_what_is_allowed(field, value):
    with pytest.raises(ConfigError, match=rf"dataset\.{field} must be one of .*got {value!r}"):
        DatasetConfig(**{field: value})


def test_augmentation_through_a_strategys_distribution_is_repeatable_and_new_each_epoch(
        staged_digits):
    """Keras hands the pipeline to the strategy (rebatched per replica, sharded by
    data): the seed stream must survive that, each epoch new, each run the same."""
    import tensorflow as tf

    builder = load_builder(staged_digits)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def epochs(count=2):
        ds = make_dataset(builder, "train", global_batch_size=100, shuffle=True, seed=5,
                          augment="flip_crop")
        dist = strategy.experimental_distribute_dataset(ds)
        out = []
        for _ in range(count):
            out.append(np.concatenate([
                np.concatenate([t.numpy() for t in strategy.experimental_local_results(x)])
                for x, _ in dist]))
        return out

    first, second = epochs()
    assert first.shape == (1258, 8, 8, 1)
    assert not np.array_equal(first, second)
    again = epochs(1)[0]
    assert np.array_equal(first, again)
