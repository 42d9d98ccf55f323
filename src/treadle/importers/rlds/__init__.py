"""RLDS (TFDS TFRecord) imports without TensorFlow: see :mod:`.rlds_import`."""

from treadle.importers.rlds.rlds_import import episode_name, import_rlds

__all__ = ["episode_name", "import_rlds"]
