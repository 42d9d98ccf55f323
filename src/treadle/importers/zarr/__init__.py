"""Zarr ReplayBuffers (Diffusion Policy, UMI) -> tables."""

from treadle.importers.zarr.zarr_import import import_zarr

__all__ = ["import_zarr"]
