"""The catalog: clients, projects, branches, table references, transactions and commits."""

from treadle.catalog.client import Branch, Client, Project
from treadle.catalog.commit import Commit
from treadle.catalog.tableref import TableRef
from treadle.catalog.transaction import Transaction

__all__ = ["Branch", "Client", "Commit", "Project", "TableRef", "Transaction"]
