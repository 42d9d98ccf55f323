"""Files other tools write whose frames treadle once delivered wrong, or without a word:
each video is written with PyAV, stored through ``td.VideoFile``, and every frame read back
through the loader is compared with PyAV's own decode of the file (``to_ndarray("rgb24")``),
or the file is refused with a :class:`~treadle.errors.VideoError` naming it. Also: frames
of two sizes that one output would stack are a :class:`~treadle.errors.PlanError` when
planned, and a one-frame file gives the table its own rate."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

import treadle as td
from treadle.errors import PlanError, VideoError
from treadle.video import remux
from treadle.video._testing import make_mp4, reference_decode, synthetic_frames
from treadle.video.encode import from_container

BFRAMES = "keyint=8:min-keyint=8:scenecut=0:bframes=3:b-pyramid=normal"


def _table(root, videos: dict[str, bytes]) -> td.TableRef:
    branch = td.Client(str(root)).project("p").branch()
    for name, data in videos.items():
        branch.table("cams").append_episode({"cam": td.VideoFile(data)}, episode=name)
    return branch.table("cams")


def _every_frame(table: td.TableRef) -> dict[int, np.ndarray]:
    """Each episode's frames as the loader delivers them (one window per anchor frame)."""
    comp = td.Component(table, td.Windows({"cam": td.Video([0])}))
    got: dict[int, dict[int, np.ndarray]] = {}
    for batch in td.EvalLoader(comp, batch_size=4):
        for e, f, clip, ok in zip(
            batch["_episode"].tolist(),
            batch["_frame"].tolist(),
            batch["cam"].numpy(),
            batch["_valid"].tolist(),
        ):
            if ok:
                got.setdefault(e, {})[f] = clip[0]
    return {e: np.stack([d[f] for f in range(len(d))]) for e, d in got.items()}


@pytest.mark.parametrize("params", [BFRAMES, BFRAMES + ":open-gop=1"])
def test_avi_with_b_frames_reads_each_frame_as_pyav_decodes_it(tmp_path, params):
    # AVI stores no presentation times: FFmpeg stamps its packets in decode order, so a
    # stream with B-frames looked like one without reordering. Before: frame k was the
    # k-th packet in decode order (18 of 25 frames wrong, up to 27 levels), and with an
    # open GOP a window failed at read time ("decoder produced no picture").
    frames = synthetic_frames(25, 32, 48, seed=3)
    avi = make_mp4(frames, fmt="avi", options={"x264-params": params})
    with av.open(io.BytesIO(avi)) as c:  # the file is what the test says: stamps in decode order
        pts = [p.pts for p in c.demux(video=0) if p.size]
    assert pts == sorted(pts)
    got = _every_frame(_table(tmp_path, {"avi": avi}))[0]
    np.testing.assert_array_equal(got, reference_decode(avi))


def test_in_order_stamps_without_b_frames_are_kept(monkeypatch):
    # a stream with no B slices has nothing to reorder: its own times stay (no decode pass)
    frames = synthetic_frames(12, 32, 48, seed=4)
    avi = make_mp4(frames, fmt="avi", options={"x264-params": "keyint=4:bframes=0"})
    monkeypatch.setattr(remux, "_display_ranks", None)  # never called
    s = from_container(avi)
    assert s.index.pts.tolist() == list(range(1, 13)) and s.index.decode.tolist() == list(range(12))


def _cut_in_last_packet(data: bytes) -> bytes:
    """``data`` cut off halfway through its last video packet (a recording interrupted)."""
    with av.open(io.BytesIO(data)) as c:
        last = [p for p in c.demux(video=0) if p.size][-1]
        assert last.pos is not None and last.pos > 0
        return data[: last.pos + last.size // 2]


def _flagged(data: bytes) -> int:
    """How many packets the demuxer, and frames the decoder, flag corrupt (1: it raises)."""
    with av.open(io.BytesIO(data)) as c:
        bad = 0
        try:
            for packet in c.demux(video=0):
                bad += packet.is_corrupt
                bad += sum(f.is_corrupt for f in packet.decode())
        except av.FFmpegError:
            return 1
    return bad


@pytest.mark.parametrize(
    ("codec", "fmt"),
    [("libx264", "h264"), ("libx264", "mpegts"), ("mpeg4", "avi"), ("libvpx-vp9", "ivf")],
)
def test_a_recording_cut_off_mid_picture_is_refused_when_written(tmp_path, codec, fmt):
    # before: stored, and its last frame delivered concealed (grey or smeared: up to 130
    # levels from PyAV's own, equally damaged, decode) without a word
    # noise: every picture spans many transport packets, so half of one is cut
    frames = np.random.default_rng(7).integers(0, 256, (30, 64, 96, 3), np.uint8)
    options = {"x264-params": "keyint=10:bframes=0"} if codec == "libx264" else {}
    cut = _cut_in_last_packet(make_mp4(frames, codec=codec, fmt=fmt, options=options))
    assert _flagged(cut)  # FFmpeg itself says so (and conceals it)
    branch = td.Client(str(tmp_path)).project("p").branch()
    with pytest.raises(VideoError, match="is damaged") as e:
        branch.table("cams").append_episode({"cam": td.VideoFile(cut)}, episode="cut")
    assert "episode 'cut'" in str(e.value) and "cams" not in branch.tables()


def test_a_lost_transport_packet_is_refused_when_written(tmp_path):
    # an MPEG-TS recording missing one 188-byte packet mid-stream: the demuxer flags the
    # picture's packet corrupt, the decoder conceals it without a flag (before: stored and
    # delivered smeared)
    ts = make_mp4(synthetic_frames(30, 64, 96, seed=7), fmt="mpegts")
    n = len(ts) // 188
    holed = next(
        (h for k in range(n // 3, n) if _flagged(h := ts[: 188 * k] + ts[188 * (k + 1) :])),
        None,
    )
    assert holed is not None
    branch = td.Client(str(tmp_path)).project("p").branch()
    with pytest.raises(VideoError, match="is damaged"):
        branch.table("cams").append_episode({"cam": td.VideoFile(holed)}, episode="holed")


def _cams(root, sizes: dict[str, tuple[str, tuple[int, int]]]) -> td.Branch:
    """Episodes of 6 frames: ``{episode: (table, (H, W))}``."""
    branch = td.Client(str(root)).project("p").branch()
    for k, (name, (table, (h, w))) in enumerate(sizes.items()):
        clip = td.VideoFrames(synthetic_frames(6, h, w, seed=k), fps=10)
        branch.table(table).append_episode({"cam": clip}, episode=name)
    return branch


def _plan(*components):
    return td.Recipe(seed=0, batch_size=4, components=list(components)).plan()


def test_episodes_of_two_sizes_without_size_are_refused_when_planned(tmp_path):
    # before: planned, and the loader stopped at the first step that drew both sizes
    # (a random step of the run) with "decodes to (1, 32, 48, 3), the batch holds ..."
    branch = _cams(tmp_path, {"a": ("t", (48, 64)), "b": ("t", (32, 48)), "c": ("t", (48, 64))})
    table = branch.table("t")
    with pytest.raises(PlanError) as e:
        _plan(td.Component(table, td.Windows({"cam": td.Video([0])})))
    msg = str(e.value)
    assert "'cam'" in msg and "48x64" in msg and "episode 'a'" in msg and "32x48" in msg
    assert "episode 'b'" in msg and "size=(H, W)" in msg
    # what the run reads decides: one size selected, or one size asked for, plans and reads
    one = _plan(td.Component(table, td.Windows({"cam": td.Video([0])}), episodes=["a", "c"]))
    assert next(iter(td.TrainLoader(one, steps=1)))["cam"].shape == (4, 1, 48, 64, 3)
    sized = _plan(td.Component(table, td.Windows({"cam": td.Video([0], size=(32, 48))})))
    assert next(iter(td.TrainLoader(sized, steps=1)))["cam"].shape == (4, 1, 32, 48, 3)


def test_the_size_check_reads_only_the_index_sizes_a_block_at_a_time(tmp_path, monkeypatch):
    """Of a table written before frame sizes were recorded, the plan reads the frame sizes
    of every episode its anchors reach: only the index's width and height, in blocks (a
    million episodes' whole index rows at once broke the plan's flat memory)."""
    import lance

    from treadle.plan import video_sizes
    from treadle.table import write

    with monkeypatch.context() as m:  # as an earlier treadle wrote it
        m.setattr(write, "with_frame_sizes", lambda schema, rows, fresh: schema)
        branch = _cams(tmp_path, {f"e{i}": ("t", (32, 48)) for i in range(5)})
    asked, real = [], lance.LanceDataset.take
    monkeypatch.setattr(video_sizes, "_BLOCK", 2)

    def take(self, indices, columns=None, **kw):
        asked.append((len(indices), columns))
        return real(self, indices, columns=columns, **kw)

    monkeypatch.setattr(lance.LanceDataset, "take", take)
    _plan(td.Component(branch.table("t"), td.Windows({"cam": td.Video([0])})))
    sizes = [a for a in asked if a[1] == ["cam.width", "cam.height"]]
    assert [n for n, _ in sizes] == [2, 2, 1]
    assert not [a for a in asked if a[1] == ["cam"]]


def test_tables_of_two_sizes_in_one_output_are_refused_when_planned(tmp_path):
    branch = _cams(tmp_path, {"a": ("big", (48, 64)), "b": ("small", (32, 48))})
    big, small = branch.table("big"), branch.table("small")
    cam = td.Windows({"cam": td.Video([0])})
    with pytest.raises(PlanError, match=r"table 'big'.*table 'small'"):
        _plan(td.Component(big, cam), td.Component(small, cam))
    sized = td.Windows({"cam": td.Video([0], size=(48, 64))})
    with pytest.raises(PlanError, match=r"32x48 .*component 1, table 'small'"):
        _plan(td.Component(big, sized), td.Component(small, cam))
    # renamed apart, each output keeps its own size
    plan = _plan(td.Component(big, cam), td.Component(small, cam, rename={"cam": "wrist"}))
    assert plan.record.components[1].rename == (("cam", "wrist"),)


def test_a_one_frame_transport_stream_gives_the_table_its_own_rate(tmp_path):
    # a one-frame MPEG-TS has no average rate and FFmpeg guesses its field rate: before,
    # the table's fps became 60, Video(seconds=[0, 1/30]) read frame offsets (0, 2), and the
    # next 30 fps episode was refused ("has fps 60; this write gives fps 30")
    frames = synthetic_frames(12, 32, 48, seed=12)
    one, full = (make_mp4(f, fmt="mpegts") for f in (frames[:1], frames))
    with av.open(io.BytesIO(one)) as c:
        assert c.streams.video[0].average_rate is None  # what the test is about
    table = _table(tmp_path, {"one": one, "full": full})
    assert table.fps == 30.0 and table.num_moments == 13


def _cut_at_second_keyframe(data: bytes) -> bytes:
    """The packets of ``data`` from its second keyframe on, copied into an MKV as they are
    (``ffmpeg -ss ... -c copy`` at a keyframe): no edit list hides what precedes it."""
    buf = io.BytesIO()
    with av.open(io.BytesIO(data)) as c, av.open(buf, "w", format="matroska") as out:
        src = c.streams.video[0]
        dst = out.add_stream_from_template(src)
        keys = 0
        for p in c.demux(src):
            keys += bool(p.size and p.is_keyframe)
            if p.size and keys >= 2:
                p.stream = dst
                out.mux(p)
    return buf.getvalue()


def test_a_file_cut_at_an_open_gops_i_picture_holds_what_pyav_shows(tmp_path):
    # its first keyframe is a non-IDR I picture with SPS/PPS only in the MKV's header,
    # followed (in decode order) by B pictures shown before it that reference pictures
    # cut away. Before: refused ("keyframe without SPS/PPS"), though PyAV plays it; once
    # the header's SPS/PPS were used, a row per packet kept those B pictures, which FFmpeg
    # drops, and a window at frame 0 failed when read. They are re-encoded to the
    # pictures FFmpeg shows.
    frames = synthetic_frames(40, 48, 64, seed=13)
    params = "keyint=10:min-keyint=10:scenecut=0:bframes=3:b-pyramid=normal:open-gop=1"
    cut = _cut_at_second_keyframe(make_mp4(frames, fmt="matroska", options={"x264-params": params}))
    ref = reference_decode(cut).astype(int)
    got = _every_frame(_table(tmp_path, {"cut": cut}))[0].astype(int)
    assert got.shape == ref.shape  # one row per picture PyAV shows
    err = np.abs(got - ref).mean(axis=(1, 2, 3))
    assert err.max() < 4  # re-encoded, frame k against PyAV's frame k
    assert (err[:-1] < np.abs(got[:-1] - ref[1:]).mean(axis=(1, 2, 3))).all()  # in order


def test_sps_and_pps_only_in_an_annexb_header_are_used(tmp_path):
    # NUT keeps H.264's global header as Annex-B units, not an avcC record: before, every
    # such file was refused ("keyframe without SPS/PPS")
    frames = synthetic_frames(20, 32, 48, seed=14)
    nut = make_mp4(frames, fmt="nut", options={"x264-params": BFRAMES})
    got = _every_frame(_table(tmp_path, {"nut": nut}))[0]
    np.testing.assert_array_equal(got, reference_decode(nut))
