"""Bad input, fuzzed with hypothesis: only treadle's documented errors, no hangs, no escapes.

Targets: table/branch/project names (``check_name`` and the Client API, with the files
on disk checked), recipes (``Recipe``/``Component``/``Windows``/``Video``/``Rows``), run
records (``RunRecord.from_json``), loader states (``TrainLoader.from_state``) and the
importers' parsers (WebDataset tar, MDS index and shards, LeRobot metadata, parquet).
Every example runs under a SIGALRM timeout; pickle and ``torch.load`` are booby-trapped
so that any unpickling without opt-in fails the test.

Iterations per target: 300 (names, run records), 60 (recipes, loader states), 25 per
importer; multiply with ``TREADLE_FUZZ_SCALE``. The last test prints the outcomes.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import resource
import signal
import tarfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import treadle as td
import treadle.importers as ti
from loader_helpers import make_project, recipe
from treadle.errors import TreadleError
from treadle.names import check_name

SCALE = float(os.environ.get("TREADLE_FUZZ_SCALE", "1"))  # e.g. 10 for a long local run
EXAMPLE_TIMEOUT_S = 10


def fuzz(examples: int):
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,  # the same examples in CI every time
    )


CHEAP, MEDIUM, IMPORTS = fuzz(300), fuzz(60), fuzz(25)


class Hang(Exception):
    pass


@contextmanager
def bounded(seconds: int = EXAMPLE_TIMEOUT_S):
    """Fail (not hang) when the body runs longer than ``seconds``."""

    def alarm(*_: object) -> None:
        raise Hang(f"example ran longer than {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def no_unpickling(monkeypatch):
    """Any pickle/torch.load call during a fuzz test is a failure."""

    def trap(*a: object, **k: object) -> None:
        raise AssertionError("something was unpickled without allow_pickle=True")

    class Trap(pickle.Unpickler):
        def __init__(self, *a: object, **k: object) -> None:
            trap()

    monkeypatch.setattr(pickle, "loads", trap)
    monkeypatch.setattr(pickle, "load", trap)
    monkeypatch.setattr(pickle, "Unpickler", Trap)
    import torch

    monkeypatch.setattr(torch, "load", trap)


def _rss_mb() -> float:
    """This process's peak RSS since :func:`_peak_from_now` (Linux), else since it began."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_from_now() -> float:
    """Start counting the peak RSS from here (Linux: ``clear_refs`` 5); the RSS now. Under
    xdist a worker runs other files' tests before this one's, and their peak is not this
    file's (a test that built a 256 MB parquet row once failed this one)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _rss_mb()


@pytest.fixture(scope="module", autouse=True)
def _start_rss() -> None:
    global START_RSS_MB
    START_RSS_MB = _peak_from_now()


OUTCOMES: Counter[str] = Counter()  # (test, "ok" | error class): printed by the last test


def only_documented(fn, *args, **kwargs):
    """Run ``fn``; a TreadleError is fine, any other exception (or a hang) fails."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
    with bounded():
        try:
            out = fn(*args, **kwargs)
            OUTCOMES[f"{test}: ok"] += 1
            return out
        except TreadleError as e:
            OUTCOMES[f"{test}: {type(e).__name__}"] += 1
            return None


# -- names -------------------------------------------------------------------------------
NASTY = [
    "..",
    ".",
    "../x",
    "a/../../b",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "..\\..\\x",
    "\x00",
    "a\x00b",
    "~",
    "~root",
    "C:x",
    "%2e%2e",
    " ",
    "a" * 129,
    "a..b",
    "-x",
    ".hidden",
    "ok\n",
    "é",
    "\u2215etc",
]
names = st.one_of(
    st.sampled_from(NASTY), st.text(max_size=40), st.from_regex(r"[A-Za-z0-9._/\\-]{1,12}")
)


@CHEAP
@given(name=names)
def test_check_name_accepts_only_single_safe_segments(name):
    try:
        ok = check_name(name, "table")
    except td.InvalidName:
        return
    assert ok == name
    assert "/" not in name and "\\" not in name and ".." not in name
    assert name not in (".", "") and name[0].isalnum() and name.isascii() and name.isprintable()


@pytest.fixture(scope="module")
def name_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("names")
    root = base / "store"
    root.mkdir()
    return base, root


@MEDIUM
@given(project=names, branch=names, table=names, column=names)
def test_client_names_never_leave_the_root(name_root, project, branch, table, column):
    base, root = name_root
    client = td.Client(str(root))
    with bounded():
        try:
            p = client.project(project)
            b = p.create_branch(branch) if branch != "main" else p.branch()
            b.table(table).append({column: np.arange(2)})
        except (TreadleError, td.AlreadyExists):
            pass
    outside = [str(f) for f in base.rglob("*") if root not in f.parents and f != root]
    assert outside == []
    for f in root.rglob("*"):  # every path segment under the root is a checked name
        rel = f.relative_to(root).parts
        assert ".." not in rel


# -- recipes, run records, loader states -------------------------------------------------
@pytest.fixture(scope="module")
def video_branch(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-video") / "store"
    return make_project(str(root), episodes=2, frames=12)


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
good_offsets = st.lists(st.integers(min_value=-3, max_value=3), min_size=1, max_size=4)
offsets = st.one_of(
    good_offsets,
    good_offsets,
    st.lists(st.integers(min_value=-50, max_value=50), max_size=6),
    st.integers(min_value=-5, max_value=5),
    json_values,
)


BAD_VALUES = st.one_of(
    json_values,
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(-50, 50), max_size=6),
    st.sampled_from(["x", "", "TCHW", "float16", "bfloat16", "int3", "cam", "episode", "../x"]),
    st.tuples(st.integers(-2, 40), st.integers(-2, 40)),
)
FIELDS = [None, "seed", "batch", "weight0", "weight1", "cam", "action", "size", "layout", "dtype"]
FIELDS += ["column", "extra_component"]


@MEDIUM
@given(
    seed=st.integers(0, 2**31),
    batch=st.sampled_from([2, 4, 8]),
    w0=st.floats(0.01, 10),
    w1=st.floats(0.01, 10),
    cam=good_offsets.map(lambda o: sorted(set(o))),
    action=good_offsets.map(lambda o: sorted(set(o))),
    size=st.one_of(st.none(), st.sampled_from([(16, 16), (8, 24)])),
    layout=st.sampled_from(["THWC", "TCHW"]),
    dtype=st.sampled_from(["uint8", "float32"]),
    bad_field=st.sampled_from(FIELDS),  # one field (or none) replaced by a bad value
    bad=BAD_VALUES,
)
def test_recipes_fail_only_with_plan_errors(
    video_branch, seed, batch, w0, w1, cam, action, size, layout, dtype, bad_field, bad
):
    v = dict(
        seed=seed, batch=batch, weight0=w0, weight1=w1, cam=cam, action=action, size=size,
        layout=layout, dtype=dtype, column="action", extra_component=None,
    )  # fmt: skip
    if bad_field is not None:
        v[bad_field] = bad
    assume(bad_field != "column" or isinstance(bad, (str, int, float, tuple, type(None))))

    def build():
        video = td.Video(v["cam"], size=v["size"], layout=v["layout"], dtype=v["dtype"])
        w = td.Windows({"cam": video, v["column"]: td.Rows(v["action"])})
        comps = [
            td.Component(video_branch.table("failed"), w, weight=v["weight0"]),
            td.Component(video_branch.table("nominal"), w, weight=v["weight1"]),
        ]
        if v["extra_component"] is not None:
            comps.append(td.Component(v["extra_component"], w))
        plan = td.Recipe(seed=v["seed"], batch_size=v["batch"], components=comps).plan()
        plan.batch(0)
        return [b["_moment"].tolist() for b in td.TrainLoader(plan, steps=1)]

    only_documented(build)


@pytest.fixture(scope="module")
def good_state(video_branch):
    loader = td.TrainLoader(recipe(video_branch, batch_size=4), steps=2)
    next(iter(loader))
    return loader.state_dict()


def _mutate(value, path_choice: int, new):
    """Replace the ``path_choice``-th node (pre-order) of ``value`` with ``new``."""
    nodes = []

    def walk(v, parent, key):
        nodes.append((parent, key))
        if isinstance(v, dict):
            for k in list(v):
                walk(v[k], v, k)
        elif isinstance(v, list):
            for i in range(len(v)):
                walk(v[i], v, i)

    root = {"r": copy.deepcopy(value)}
    walk(root["r"], root, "r")
    parent, key = nodes[path_choice % len(nodes)]
    if new == "__delete__" and isinstance(parent, dict) and parent is not root:
        del parent[key]
    else:
        parent[key] = new
    return root["r"]


@CHEAP
@given(
    where=st.integers(min_value=0, max_value=10_000),
    new=st.one_of(json_values, st.just("__delete__")),
    drop_id=st.booleans(),
)
def test_run_records_parse_or_raise_plan_error(good_state, where, new, drop_id):
    record = copy.deepcopy(good_state["record"])
    if drop_id:
        record.pop("run_id", None)  # get past the id check into every field's validation
    bad = _mutate(record, where, new)
    for form in (bad, json.dumps(bad, allow_nan=True)):
        only_documented(td.RunRecord.from_json, form)


@CHEAP
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_run_record_from_junk_text(text):
    with bounded():
        with pytest.raises(td.PlanError):
            td.RunRecord.from_json(text)


@MEDIUM
@given(
    where=st.integers(min_value=0, max_value=10_000),
    new=st.one_of(json_values, st.just("__delete__")),
    drop_id=st.booleans(),
)
def test_loader_states_restore_or_raise_plan_error(video_branch, good_state, where, new, drop_id):
    state = copy.deepcopy(good_state)
    if drop_id:
        state["record"].pop("run_id", None)
    bad = _mutate(state, where, new)
    client = video_branch.project.client

    def restore():
        loader = td.TrainLoader.from_state(bad, client, steps=1)
        return [b["_moment"].tolist() for b in loader]

    only_documented(restore)


# -- importers -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def import_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-import") / "store"
    root.mkdir()
    return td.Client(str(root)).project("imp")


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


GOOD_TAR = _tar(
    [
        (f"s{i}.{ext}", v)
        for i in range(4)
        for ext, v in (("cls", b"3"), ("txt", b"hi"), ("json", b'{"a": 1}'))
    ]
)
EVIL = pickle.dumps({"x": 1})  # pickle.dumps is not trapped; loading it would be


def _flip(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    b = bytearray(data)
    for pos, val in flips:
        if b:
            b[pos % len(b)] = val
    return bytes(b[: cut % (len(b) + 1)] if cut is not None else b)


byte_edits = st.tuples(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
    st.one_of(st.none(), st.integers(0, 1 << 20)),
)


@IMPORTS
@given(edit=byte_edits, evil=st.booleans(), n=st.integers(0, 10**6))
def test_webdataset_tar_parser(import_root, tmp_path_factory, edit, evil, n):
    folder = tmp_path_factory.mktemp("wds")
    data = _tar([("s0.pyd", EVIL), ("s0.cls", b"1")]) if evil else GOOD_TAR
    (folder / "shard-000000.tar").write_bytes(_flip(data, *edit))
    only_documented(
        ti.webdataset,
        str(folder / "shard-000000.tar"),
        import_root,
        f"w{n}",
        progress=False,
    )


MDS_INDEX = {
    "version": 2,
    "shards": [
        {
            "column_encodings": ["int", "str", "bytes"],
            "column_names": ["label", "name", "blob"],
            "column_sizes": [8, None, None],
            "compression": None,
            "format": "mds",
            "hashes": [],
            "raw_data": {"basename": "shard.00000.mds", "bytes": 0, "hashes": {}},
            "samples": 3,
            "size_limit": 1 << 20,
            "version": 2,
            "zip_data": None,
        }
    ],
}


def _mds_shard(samples: list[tuple[int, bytes, bytes]]) -> bytes:
    """A raw MDS shard: num samples, offsets, then per sample the var sizes and values."""
    bodies = []
    for label, name, blob in samples:
        bodies.append(
            np.array([len(name), len(blob)], np.uint32).tobytes()
            + np.int64(label).tobytes()
            + name
            + blob
        )
    n = len(bodies)
    header = 4 + 4 * (n + 1)
    offs = [header]
    for b in bodies:
        offs.append(offs[-1] + len(b))
    return np.uint32(n).tobytes() + np.array(offs, np.uint32).tobytes() + b"".join(bodies)


GOOD_MDS = _mds_shard([(i, f"n{i}".encode(), bytes([i]) * i) for i in range(3)])


def _mds_folder(tmp_path_factory, index: dict, shard: bytes) -> Path:
    folder = tmp_path_factory.mktemp("mds")
    (folder / "index.json").write_text(json.dumps(index))
    (folder / "shard.00000.mds").write_bytes(shard)
    return folder


def _mds_index() -> dict:
    index = copy.deepcopy(MDS_INDEX)
    index["shards"][0]["raw_data"]["bytes"] = len(GOOD_MDS)
    return index


@IMPORTS
@given(edit=byte_edits, n=st.integers(0, 10**6))
def test_mds_shard_parser(import_root, tmp_path_factory, edit, n):
    folder = _mds_folder(tmp_path_factory, _mds_index(), _flip(GOOD_MDS, *edit))
    only_documented(ti.mds, str(folder), import_root, f"m{n}", progress=False)


# Found by this fuzzer and fixed in f367fb3: malformed index.json entries used to escape
# as TypeError/KeyError/ValueError from mds.read_index and mds.decode_sample.
@IMPORTS
@given(
    where=st.integers(0, 10_000),
    new=st.one_of(
        json_values,
        st.just("__delete__"),
        st.sampled_from(["pkl", "../../x", "zstd", "ndarray:float32:7"]),
    ),
    n=st.integers(0, 10**6),
)
def test_mds_index_parser(import_root, tmp_path_factory, where, new, n):
    folder = _mds_folder(tmp_path_factory, _mutate(_mds_index(), where, new), GOOD_MDS)
    only_documented(ti.mds, str(folder), import_root, f"m{n}", progress=False)


def test_mds_pickle_column_is_refused(import_root, tmp_path_factory):
    index = _mds_index()
    index["shards"][0]["column_encodings"] = ["pkl", "str", "bytes"]
    folder = _mds_folder(tmp_path_factory, index, GOOD_MDS)
    with pytest.raises(TreadleError, match="pkl"):
        ti.mds(str(folder), import_root, "pkl", progress=False)


def test_webdataset_pickle_member_is_refused(import_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("wds-evil")
    (folder / "shard-000000.tar").write_bytes(_tar([("s0.pyd", EVIL), ("s0.cls", b"1")]))
    with pytest.raises(ti.UnsafeInput):
        ti.webdataset(str(folder / "shard-000000.tar"), import_root, "evil", progress=False)


def _lerobot_info() -> dict:
    return {
        "codebase_version": "v3.0",
        "fps": 10,
        "total_episodes": 1,
        "total_frames": 4,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": {
            "action": {"dtype": "float32", "shape": [2], "names": None},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": {"dtype": "int64", "shape": [1], "names": None},
            "episode_index": {"dtype": "int64", "shape": [1], "names": None},
            "index": {"dtype": "int64", "shape": [1], "names": None},
            "task_index": {"dtype": "int64", "shape": [1], "names": None},
        },
    }


# Found by this fuzzer and fixed in f367fb3: a non-object info.json, a non-dict feature
# or a non-integer shape used to escape as AttributeError/TypeError.
@IMPORTS
@given(
    where=st.integers(0, 10_000),
    new=st.one_of(json_values, st.just("__delete__")),
    raw=st.one_of(st.none(), st.binary(max_size=64)),
    n=st.integers(0, 10**6),
)
def test_lerobot_metadata_parser(import_root, tmp_path_factory, where, new, raw, n):
    folder = tmp_path_factory.mktemp("lerobot")
    meta = folder / "meta"
    meta.mkdir()
    info = _mutate(_lerobot_info(), where, new)
    (meta / "info.json").write_bytes(raw if raw is not None else json.dumps(info).encode())
    pq.write_table(pa.table({"task_index": [0], "task": ["t"]}), meta / "tasks.parquet")
    (meta / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "episode_index": [0],
                "length": [4],
                "data/chunk_index": [0],
                "data/file_index": [0],
                "dataset_from_index": [0],
                "dataset_to_index": [4],
            }
        ),
        meta / "episodes" / "chunk-000" / "file-000.parquet",
    )
    (folder / "data" / "chunk-000").mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "action": [[0.0, 1.0]] * 4,
                "timestamp": [0.0, 0.1, 0.2, 0.3],
                "frame_index": [0, 1, 2, 3],
                "episode_index": [0] * 4,
                "index": [0, 1, 2, 3],
                "task_index": [0] * 4,
            }
        ),
        folder / "data" / "chunk-000" / "file-000.parquet",
    )
    only_documented(ti.lerobot, str(folder), import_root, f"l{n}", progress=False)


def _parquet_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": np.arange(20), "s": [f"r{i}" for i in range(20)]}), buf)
    return buf.getvalue()


GOOD_PARQUET = _parquet_bytes()


@IMPORTS
@given(edit=byte_edits, n=st.integers(0, 10**6))
def test_parquet_parser(import_root, tmp_path_factory, edit, n):
    folder = tmp_path_factory.mktemp("hf")
    (folder / "train-00000-of-00001.parquet").write_bytes(_flip(GOOD_PARQUET, *edit))
    only_documented(ti.hf, str(folder), import_root, f"h{n}", progress=False)


START_RSS_MB = _rss_mb()


# Found by this fuzzer at TREADLE_FUZZ_SCALE=5: a window offset beyond int64 used to pass
# Video/Rows validation and overflow in the windows' eligible span (OverflowError).
@pytest.mark.parametrize("offset", [2**63, -(2**63) - 1, 2**80])
def test_huge_window_offset_is_a_plan_error(video_branch, offset):
    with bounded(), pytest.raises(TreadleError, match="offsets must be within"):
        w = td.Windows({"cam": td.Video([offset]), "action": td.Rows([0])})
        comps = [
            td.Component(video_branch.table("failed"), w),
            td.Component(video_branch.table("nominal"), w),
        ]
        td.Recipe(seed=0, batch_size=2, components=comps).plan().batch(0)


def test_fuzzing_memory_stayed_bounded():
    """Runs last in this file: the whole fuzz session grew RSS by less than 1.5 GiB."""
    for k, v in sorted(OUTCOMES.items()):
        print(f"{k}: {v}")
    assert _rss_mb() < 1536 + START_RSS_MB, _rss_mb()
