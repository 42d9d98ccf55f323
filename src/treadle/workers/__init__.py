"""The worker runtime: worker processes that read a loader's steps (``worker.py``, no
torch), the preloaded process server they fork from (``serverinit.py``), the
shared-memory slots batches cross in (``slots.py``) and the loader's side
(``processes.py``)."""
