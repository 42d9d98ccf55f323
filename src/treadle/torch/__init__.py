"""PyTorch adapters: TrainLoader, EvalLoader, ScanDataset, Checkpoints."""

from treadle.torch.checkpoints import CheckpointRow, Checkpoints
from treadle.torch.evaluation import EvalLoader
from treadle.torch.loader import TrainLoader
from treadle.torch.scan import ScanDataset

__all__ = ["CheckpointRow", "Checkpoints", "EvalLoader", "ScanDataset", "TrainLoader"]
