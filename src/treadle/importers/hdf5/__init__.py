"""HDF5 robot demonstrations (robomimic, LIBERO, MimicGen, RoboCasa, ALOHA) -> tables."""

from treadle.importers.hdf5.hdf5_import import import_hdf5

__all__ = ["import_hdf5"]
