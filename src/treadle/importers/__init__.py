"""Importers: WebDataset, MosaicML Streaming (MDS), LeRobot and Hugging Face datasets -> tables.

Each importer is a thin mapping of a foreign format onto ``append`` / ``append_episode``
inside one ``branch.transaction(...)``: one commit, the branch moves once, and nothing
is unpickled unless ``allow_pickle=True``. Use ``td.importers.webdataset(...)``,
``.mds(...)``, ``.lerobot(...)``, ``.hf(...)``, ``.rlds(...)``; robot data: ``.hdf5(...)``,
``.zarr(...)``, ``.ros2(...)``.

The package by concern: :mod:`~treadle.importers.sources` (where files are read from,
checked paths, file identity), :mod:`~treadle.importers.arrow` and
:mod:`~treadle.importers.images` (decoded values -> Arrow), :mod:`~treadle.importers.run`
(the options every importer shares, the import id, one transaction: how imports resume),
:mod:`~treadle.importers.executor` (where the work runs), then one module per format.
"""

from treadle.errors import UnsafeInput, UnsupportedFormat
from treadle.importers.hdf5 import import_hdf5 as hdf5
from treadle.importers.hf import import_hf as hf
from treadle.importers.lerobot_import import import_lerobot as lerobot
from treadle.importers.mds import import_mds as mds
from treadle.importers.rlds import import_rlds as rlds
from treadle.importers.ros2 import import_ros2 as ros2
from treadle.importers.run import ImportResult
from treadle.importers.webdataset import import_webdataset as webdataset
from treadle.importers.zarr import import_zarr as zarr

__all__ = [
    "ImportResult",
    "UnsafeInput",
    "UnsupportedFormat",
    "hdf5",
    "hf",
    "lerobot",
    "mds",
    "rlds",
    "ros2",
    "webdataset",
    "zarr",
]
