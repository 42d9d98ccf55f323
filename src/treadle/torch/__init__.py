"""PyTorch adapters: TrainLoader, ScanDataset, Checkpoints."""

from treadle.torch.checkpoints import CheckpointRow, Checkpoints
from treadle.torch.loader import TrainLoader
from treadle.torch.scan import ScanDataset

__all__ = ["CheckpointRow", "Checkpoints", "ScanDataset", "TrainLoader"]
