"""Video windows end to end: store -> VideoReader -> frames equal a sequential decode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import treadle.video as tv
from treadle.errors import CorruptData, NotFound, VideoError
from treadle.plan.windows import Video
from treadle.storage import Store
from treadle.storage.store_errors import ChangedObject
from treadle.video._testing import (
    make_mp4,
    reference_decode,
    reference_frames,
    synthetic_frames,
)

WHERE = ("grasps", "ep-0007", "wrist_camera")


@pytest.fixture
def store(tmp_path) -> Store:
    return Store.open(str(tmp_path / "root"), create=True)


def put(store: Store, s: tv.EncodedStream, table: str = "grasps") -> tuple[str, tv.StreamIndex]:
    """Store like the table writer does and read the index back through arrow."""
    key = s.media_key(table)
    store.put(f"projects/p/{key}", s.data)
    return tv.index_from_arrow(tv.index_to_arrow(key, s))


def random_windows(rng: np.random.Generator, n: int, count: int) -> list[np.ndarray]:
    out = []
    for _ in range(count):
        length = int(rng.integers(1, min(n, 40) + 1))
        start = int(rng.integers(0, n - length + 1))
        frames = np.arange(start, start + length)
        if rng.random() < 0.3:  # sparse / unordered offsets too
            frames = rng.permutation(frames)[: max(1, length // 3)]
        out.append(frames)
    out.append(np.arange(n - 3, n))  # touches the last frame
    out.append(np.array([n - 1]))
    out.append(np.array([0]))
    return out


def gop_bytes(idx: tv.StreamIndex) -> int:
    """Largest GOP (keyframe to next keyframe, decode order) in bytes."""
    dod = idx.display_of_decode
    keys = list(idx.key_decode_positions) + [len(idx)]
    return max(int(idx.size[dod[a:b]].sum()) for a, b in zip(keys[:-1], keys[1:]))


def check_windows(store, s, ref, rng, threads=1, count=12):
    key, idx = put(store, s)
    wins = random_windows(rng, len(idx), count)
    reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w))), WHERE) for w in wins]
    with tv.VideoReader(store, prefix="projects/p", threads=threads) as reader:
        outs, stats = reader.read_with_stats(reqs)
    assert len(outs) == len(wins)
    g = gop_bytes(idx)
    dec = idx.decode
    for w, out, nbytes in zip(wins, outs, stats.window_bytes):
        assert out.shape == (len(w), idx.height, idx.width, 3) and out.dtype == np.uint8
        assert np.array_equal(out, ref[w]), f"window {w[:5]}... differs from sequential decode"
        # the window's own packets, first to last in decode order
        span = np.isin(dec, np.arange(dec[w].min(), dec[w].max() + 1))
        assert nbytes < 2 * g + int(idx.size[span].sum())
    assert stats.bytes_read == sum(stats.window_bytes)
    assert stats.frames_out == sum(len(w) for w in wins)
    return stats


@pytest.mark.parametrize("gop", [1, 2, 10, 30, 60])
def test_random_windows_equal_sequential_decode(store, gop):
    frames = synthetic_frames(130, 48, 64, seed=gop)
    s = tv.encode_frames(frames, gop=gop, preset="ultrafast")
    ref = reference_decode(s.data, "h264")
    assert len(ref) == 130
    stats = check_windows(store, s, ref, np.random.default_rng(gop), threads=2 if gop == 30 else 1)
    if gop >= 10:  # reads are a fraction of the stream, not the whole file
        assert min(stats.window_bytes) < len(s.data) / 2


@pytest.mark.parametrize("open_gop", [False, True])
def test_bframe_stream_is_exact(store, open_gop):
    frames = synthetic_frames(90, 48, 64, seed=3)
    params = "bframes=2:b-pyramid=normal:keyint=12:min-keyint=12:scenecut=0"
    if open_gop:
        params += ":open-gop=1"
    mp4 = make_mp4(frames, options={"preset": "ultrafast", "x264-params": params})
    s = tv.from_container(mp4)
    idx = s.index
    assert not np.array_equal(idx.decode, np.arange(len(idx)))  # really reordered
    ref = reference_decode(mp4)
    assert len(ref) == 90
    check_windows(store, s, ref, np.random.default_rng(7), count=20)
    if open_gop:
        # a leading frame (displayed before its keyframe, decoded after it) forces the
        # range one GOP earlier
        key_disp = int(np.flatnonzero(idx.key)[1])
        leading = [i for i in range(key_disp) if idx.decode[i] > idx.decode[key_disp]]
        assert leading
        plan = tv.plan_window(idx, [leading[0]])
        assert plan.start == 0


def test_imported_mp4_round_trips(store, tmp_path):
    frames = synthetic_frames(50, 48, 64, seed=11)
    mp4 = make_mp4(frames, options={"preset": "ultrafast", "g": "20"})
    path = tmp_path / "in.mp4"
    path.write_bytes(mp4)
    s = tv.encode_value(tv.VideoFile(str(path)))
    key, idx = put(store, s)
    with tv.VideoReader(store, prefix="projects/p") as reader:
        (whole,) = reader.read([tv.WindowRequest(key, idx, np.arange(50), Video(range(50)))])
    assert np.array_equal(whole, reference_decode(mp4))


def test_transforms_match_the_uint8_path(store):
    frames = synthetic_frames(40, 48, 64, seed=5)
    s = tv.encode_frames(frames, gop=10, preset="ultrafast")
    key, idx = put(store, s)
    ref = reference_decode(s.data, "h264")
    w = np.arange(13, 33)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    specs = {
        "tchw": Video(range(20), layout="TCHW"),
        "f32": Video(range(20), dtype="float32"),
        "norm": Video(range(20), dtype="float32", layout="TCHW", mean=mean, std=std),
        "f16": Video(range(20), dtype="float16", mean=mean, std=std),
        "bf16": Video(range(20), dtype="bfloat16", layout="TCHW"),
        "resize": Video(range(20), size=(24, 40)),
        "resize_norm": Video(range(20), size=(24, 40), layout="TCHW", dtype="float32", mean=mean, std=std),
    }  # fmt: skip
    with tv.VideoReader(store, prefix="projects/p") as reader:
        outs = dict(
            zip(specs, reader.read([tv.WindowRequest(key, idx, w, sp) for sp in specs.values()]))
        )
    x = ref[w]
    assert outs["tchw"].shape == (20, 3, 48, 64)
    assert np.array_equal(outs["tchw"], x.transpose(0, 3, 1, 2))
    # float: exactly torch's x / 255 in float32 (LeRobot's), then torchvision's Normalize
    assert len(np.unique(x)) > 200  # most of the 126 levels where q * (1/255) is 1 ulp off
    xf = torch.tensor(x, dtype=torch.float32) / 255
    assert torch.equal(torch.from_numpy(outs["f32"]), xf)
    m, sd = torch.tensor(mean), torch.tensor(std)
    assert torch.equal(torch.from_numpy(outs["norm"]), ((xf - m) / sd).permute(0, 3, 1, 2))
    norm = ((x.astype(np.float64) / 255 - mean) / std).transpose(0, 3, 1, 2)
    assert outs["norm"].dtype == np.float32
    np.testing.assert_allclose(outs["norm"], norm, rtol=0, atol=1e-5)
    assert outs["f16"].dtype == np.float16
    np.testing.assert_allclose(outs["f16"], norm.transpose(0, 2, 3, 1), rtol=2e-3, atol=2e-3)
    assert isinstance(outs["bf16"], torch.Tensor) and outs["bf16"].dtype == torch.bfloat16
    np.testing.assert_allclose(
        outs["bf16"].float().numpy(), x.transpose(0, 3, 1, 2) / 255, rtol=1e-2, atol=1e-2
    )
    # resize: exactly FFmpeg's scaler on the sequential decode (same call, same flags)
    seq = reference_frames(s.data, "h264")
    small = np.stack(
        [
            seq[i]
            .reformat(width=40, height=24, format="rgb24", interpolation="BILINEAR")
            .to_ndarray()
            for i in w
        ]
    )
    assert outs["resize"].shape == (20, 24, 40, 3)
    assert np.array_equal(outs["resize"], small)
    small_norm = ((small.astype(np.float64) / 255 - mean) / std).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(outs["resize_norm"], small_norm, rtol=0, atol=1e-5)


def test_decodes_into_preallocated_batch(store):
    s = tv.encode_frames(synthetic_frames(60, 48, 64), gop=30, preset="ultrafast")
    key, idx = put(store, s)
    ref = reference_decode(s.data, "h264")
    batch = np.zeros((3, 10, 48, 64, 3), np.uint8)
    tbatch = torch.zeros((2, 10, 3, 48, 64), dtype=torch.float32)
    starts = [0, 25, 50]
    reqs = [
        tv.WindowRequest(key, idx, np.arange(t, t + 10), Video(range(10)), WHERE, out=batch[i])
        for i, t in enumerate(starts)
    ]
    reqs += [tv.WindowRequest(key, idx, np.arange(t, t + 10), Video(range(10), layout="TCHW", dtype="float32"), WHERE, out=tbatch[i]) for i, t in enumerate(starts[:2])]  # fmt: skip
    with tv.VideoReader(store, prefix="projects/p", threads=2) as reader:
        outs = reader.read(reqs)
    assert all(o is r.out for o, r in zip(outs, reqs))
    for i, t in enumerate(starts):
        assert np.array_equal(batch[i], ref[t : t + 10])
    for i, t in enumerate(starts[:2]):
        want = torch.from_numpy(ref[t : t + 10]).permute(0, 3, 1, 2).float() / 255
        assert torch.equal(tbatch[i], want)
    with pytest.raises(VideoError, match="out is"):
        with tv.VideoReader(store, prefix="projects/p") as reader:
            reader.read(
                [tv.WindowRequest(key, idx, np.arange(5), Video(range(5)), WHERE, out=batch[0])]
            )


def flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x40
    return bytes(b)


def test_corrupt_byte_names_table_episode_column_frame(store):
    s = tv.encode_frames(synthetic_frames(60, 48, 64), gop=30, preset="ultrafast")
    key, idx = put(store, s)
    victim = 37
    at = int(idx.offset[victim] + idx.size[victim] // 2)
    store.put(f"projects/p/{key}", flip(s.data, at))
    with tv.VideoReader(store, prefix="projects/p") as reader:
        # a window that does not need the corrupt packet still works
        (ok,) = reader.read([tv.WindowRequest(key, idx, np.arange(0, 30), Video(range(30)), WHERE)])
        assert np.array_equal(ok, reference_decode(s.data, "h264")[:30])
        with pytest.raises(CorruptData) as e:
            reader.read([tv.WindowRequest(key, idx, np.arange(40, 50), Video(range(10)), WHERE)])
    msg = str(e.value)
    assert "'grasps'" in msg and "'ep-0007'" in msg and "'wrist_camera'" in msg
    assert "frame 37" in msg


def test_truncated_and_unchecked_corruption_is_named(store):
    s = tv.encode_frames(synthetic_frames(60, 48, 64), gop=30, preset="ultrafast")
    key, idx = put(store, s)
    where_re = "table 'grasps' episode 'ep-0007' column 'wrist_camera'"
    store.put(f"projects/p/{key}", s.data[: int(idx.offset[45])])  # cut in frame 45
    with tv.VideoReader(store, prefix="projects/p") as reader:
        with pytest.raises(CorruptData, match=f"{where_re} frame 45: stream is truncated"):
            reader.read([tv.WindowRequest(key, idx, np.arange(40, 50), Video(range(10)), WHERE)])
        # no crc recorded: garbage in place of the packets must still be a named error
        nocrc = dataclasses.replace(idx, crc=None)
        rng = np.random.default_rng(0)
        junk = bytearray(s.data)
        a, b = int(idx.offset[30]), int(idx.offset[59] + idx.size[59])
        junk[a:b] = rng.integers(0, 256, b - a, dtype=np.uint8).tobytes()
        store.put(f"projects/p/{key}", bytes(junk))
        window = tv.WindowRequest(key, nocrc, np.arange(35, 45), Video(range(10)), WHERE)
        with pytest.raises(ChangedObject, match=where_re):  # replaced since this store read it
            reader.read([window])
        with tv.VideoReader(Store.open(store.url), prefix="projects/p") as fresh:
            with pytest.raises(CorruptData, match=where_re):  # a new store: only garbage
                fresh.read([window])
        store.delete(f"projects/p/{key}")
        with pytest.raises(NotFound, match=where_re):
            reader.read([tv.WindowRequest(key, idx, np.arange(5), Video(range(5)), WHERE)])


def test_bad_requests(store):
    s = tv.encode_frames(synthetic_frames(20, 48, 64), gop=10, preset="ultrafast")
    key, idx = put(store, s)
    with tv.VideoReader(store, prefix="projects/p") as reader:
        (ok,) = reader.read([tv.WindowRequest.at(key, idx, 10, Video([-2, 0, 5]), WHERE)])
        assert np.array_equal(ok, reference_decode(s.data, "h264")[[8, 10, 15]])
        with pytest.raises(VideoError, match="frame 20 is outside"):
            reader.read([tv.WindowRequest(key, idx, np.arange(15, 21), Video(range(6)), WHERE)])
        with pytest.raises(VideoError, match="ep-0007"):
            reader.read([tv.WindowRequest(key, idx, [-1], Video(0), WHERE)])
    bad = dataclasses.replace(idx, decode=np.zeros(20, np.int32))
    with pytest.raises(VideoError, match="permutation"):
        tv.plan_window(bad, [3])


@pytest.mark.parametrize("threads, decoder_threads", [(1, 1), (2, 1), (1, 2)])
def test_mixed_streams_in_one_batch_reuse_decoders(store, threads, decoder_threads):
    """Different sizes, B-frames and no B-frames, a failing window: contexts are reused."""
    a = tv.encode_frames(synthetic_frames(45, 48, 64, seed=1), gop=15, preset="ultrafast")
    b = tv.encode_frames(synthetic_frames(45, 32, 32, seed=2), gop=10, preset="ultrafast")
    mp4 = make_mp4(
        synthetic_frames(45, 48, 64, seed=3),
        options={"preset": "ultrafast", "x264-params": "bframes=2:keyint=9:min-keyint=9"},
    )
    c = tv.from_container(mp4)
    refs = [
        reference_decode(a.data, "h264"),
        reference_decode(b.data, "h264"),
        reference_decode(mp4),
    ]
    keyed = [put(store, s) for s in (a, b, c)]
    rng = np.random.default_rng(threads)
    reqs, wants = [], []
    for i in range(24):
        k = i % 3
        start = int(rng.integers(0, 45 - 12 + 1))
        reqs.append(
            tv.WindowRequest(*keyed[k], np.arange(start, start + 12), Video(range(12)), WHERE)
        )
        wants.append(refs[k][start : start + 12])
    reader = tv.VideoReader(
        store, prefix="projects/p", threads=threads, decoder_threads=decoder_threads
    )
    with reader:
        for out, want in zip(reader.read(reqs), wants):
            assert np.array_equal(out, want)
        # a corrupt window fails with a named error; the next batch is still exact
        key, idx = keyed[0]
        bad = dataclasses.replace(idx, crc=idx.crc ^ np.uint32(1))
        with pytest.raises(CorruptData, match="ep-0007"):
            reader.read(
                [tv.WindowRequest(key, bad, np.arange(3), Video(range(3)), WHERE)] + reqs[:4]
            )
        for out, want in zip(reader.read(reqs), wants):
            assert np.array_equal(out, want)


def test_two_threads_start_the_longest_windows_first_and_keep_request_order(store):
    """A batch's windows go to the decode threads longest first (no thread is left with a
    long window at the end of the batch); outputs and errors stay in request order."""
    s = tv.encode_frames(synthetic_frames(60, 32, 32, seed=5), gop=30, preset="ultrafast")
    ref = reference_decode(s.data, "h264")
    key, idx = put(store, s)
    wins = [np.arange(30, 30 + n) for n in (1, 4, 12, 30)]  # shortest first
    reqs = [tv.WindowRequest(key, idx, w, Video(range(len(w))), WHERE) for w in wins]
    with tv.VideoReader(store, prefix="projects/p", threads=2) as reader:
        submitted = []
        submit = reader._pool.submit

        def spy(fn, window):
            submitted.append(window.plan.num_packets)
            return submit(fn, window)

        reader._pool.submit = spy
        outs = reader.read(reqs)
    assert submitted == sorted(submitted, reverse=True) and len(submitted) == 4
    for w, out in zip(wins, outs):
        assert np.array_equal(out, ref[w])


@pytest.mark.s3
def test_windows_over_s3(s3_root):
    root, options = s3_root
    store = Store.open(root, options)
    s = tv.encode_frames(synthetic_frames(60, 48, 64, seed=8), gop=20, preset="ultrafast")
    key, idx = put(store, s)
    ref = reference_decode(s.data, "h264")
    starts = [0, 17, 33, 45]
    reqs = [
        tv.WindowRequest(key, idx, np.arange(t, t + 15), Video(range(15)), WHERE) for t in starts
    ]
    with tv.VideoReader(store, prefix="projects/p", threads=2) as reader:
        outs, stats = reader.read_with_stats(reqs)
        for out, t in zip(outs, starts):
            assert np.array_equal(out, ref[t : t + 15])
        assert stats.bytes_read < 4 * len(s.data)
        store.put(f"projects/p/{key}", s.data[: int(idx.offset[50])])
        with pytest.raises(ChangedObject, match="episode 'ep-0007'.*changed while it was"):
            reader.read(reqs[3:])  # this store read the object before: replaced since
    with tv.VideoReader(Store.open(root, options), prefix="projects/p", threads=2) as reader:
        with pytest.raises(CorruptData, match="frame 50"):  # a new store: only cut short
            reader.read(reqs[3:])
