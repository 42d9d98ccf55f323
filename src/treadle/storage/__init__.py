"""One object-store root for everything treadle keeps (obstore only; Lance is not here).

- :mod:`treadle.storage.store`: :class:`Store`, keys under a root, many ranges in flight;
- :mod:`treadle.storage.cloud`: cloud roots, their options, credentials and :func:`redact`;
- :mod:`treadle.storage.retry`: transient failures retried, bounded;
- :mod:`treadle.storage.loop`: the event loop thread obstore's async calls run on;
- :mod:`treadle.storage.store_errors`: object-store failures as treadle errors.
"""

from treadle.storage.cloud import redact
from treadle.storage.store import ObjectInfo, RangeRequest, Store, default_root

__all__ = ["ObjectInfo", "RangeRequest", "Store", "default_root", "redact"]
