"""Importers: WebDataset, MosaicML Streaming (MDS), LeRobot and Hugging Face datasets -> tables.

Each importer is a thin mapping of a foreign format onto ``append`` / ``append_episode``
inside one ``branch.transaction(...)``: one commit, the branch moves once, and nothing
is unpickled unless ``allow_pickle=True``. Use ``td.importers.webdataset(...)``,
``.mds(...)``, ``.lerobot(...)``, ``.hf(...)``; see :mod:`treadle.importers._common` for
how imports resume.
"""

from treadle.importers._common import ImportResult, UnsafeInput, UnsupportedFormat
from treadle.importers.hf import import_hf as hf
from treadle.importers.lerobot import import_lerobot as lerobot
from treadle.importers.mds import import_mds as mds
from treadle.importers.webdataset import import_webdataset as webdataset

__all__ = ["ImportResult", "UnsafeInput", "UnsupportedFormat", "hf", "lerobot", "mds", "webdataset"]
