"""The catalog: clients, projects, branches and commits."""

from treadle.catalog.client import Branch, Client, Project
from treadle.catalog.commit import Commit

__all__ = ["Branch", "Client", "Commit", "Project"]
