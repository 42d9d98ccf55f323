"""Column metadata: what a writer says of a column (joint names) is kept in its field, read
back by ``table.column_metadata``, and a later write that says otherwise is refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from treadle.catalog import Client
from treadle.errors import NotFound, SchemaMismatch

NAMES = {"joint_names": ["shoulder", "elbow"]}


@pytest.fixture()
def arm(tmp_path):
    client = Client(str(tmp_path / "store"), create=True)
    return client.project("p").branch("main").table("arm")


def _episode(v=0.0):
    return {"q": np.full((3, 2), float(v)), "gripper": np.arange(3.0)}


def test_kept_read_back_and_the_same_appended_again(arm):
    arm.append_episode(_episode(), episode="a", column_metadata={"q": NAMES})
    arm.append_episode(_episode(1), episode="b", column_metadata={"q": NAMES})
    arm.append_episode(_episode(2), episode="c")  # giving none keeps the table's
    assert arm.column_metadata("q") == NAMES and arm.column_metadata("gripper") == {}
    assert arm.pin().schema.field("q").metadata[b"treadle:shape"] == b"[2]"
    assert arm.num_episodes == 3
    first = arm.at(arm.branch.log()[-2].id)
    assert first.column_metadata("q") == NAMES  # versions keep it
    with pytest.raises(NotFound, match="no column"):
        arm.column_metadata("nope")
    arm.rename_columns({"q": "joints"})  # column edits keep it with the column
    assert arm.column_metadata("joints") == NAMES


def test_other_metadata_is_refused_naming_the_column_and_both_values(arm):
    arm.append_episode(_episode(), episode="a", column_metadata={"q": NAMES})
    head = arm.branch.commit_id
    other = {"joint_names": ["elbow", "shoulder"]}
    with pytest.raises(SchemaMismatch, match=r"column 'q' has joint_names \['shoulder', 'elbow'\] "
                       r"in the table, \['elbow', 'shoulder'\] in this write"):  # fmt: skip
        arm.append_episode(_episode(), episode="b", column_metadata={"q": other})
    with pytest.raises(SchemaMismatch, match=r"column 'gripper' has unit none in the table"):
        arm.append_episode(_episode(), episode="b", column_metadata={"gripper": {"unit": "m"}})
    with pytest.raises(SchemaMismatch, match=r"names columns the episode does not have: \['x'\]"):
        arm.append_episode(_episode(), episode="b", column_metadata={"x": NAMES})
    with pytest.raises(SchemaMismatch, match="not a JSON value"):
        arm.append_episode(_episode(), episode="b", column_metadata={"q": {"n": object()}})
    assert arm.branch.commit_id == head  # nothing written


def test_in_one_transaction_the_first_episode_fixes_it(arm):
    with pytest.raises(SchemaMismatch, match="in this write"):
        with arm.branch.transaction("two") as tx:
            tx.table("arm").append_episode(_episode(), episode="a", column_metadata={"q": NAMES})
            tx.table("arm").append_episode(
                _episode(), episode="b", column_metadata={"q": {"joint_names": ["x", "y"]}}
            )
    assert arm.branch.tables() == []


def test_arrow_appends_keep_it_on_tensor_columns(arm):
    field = pa.field("v", pa.list_(pa.float32(), 2), metadata={b"treadle:meta:unit": b'"m"'})
    rows = pa.table({"v": pa.array([[1, 2], [3, 4]], pa.list_(pa.float32(), 2))})
    arm.append(rows.cast(pa.schema([field])))
    assert arm.column_metadata("v") == {"unit": "m"}
    arm.append(rows)  # none given: the table's stays
    bad = pa.field("v", field.type, metadata={b"treadle:meta:unit": b'"cm"'})
    with pytest.raises(SchemaMismatch, match="unit 'm' in the table, 'cm' in this write"):
        arm.append(rows.cast(pa.schema([bad])))
    assert arm.num_moments == 4 and arm.column_metadata("v") == {"unit": "m"}
