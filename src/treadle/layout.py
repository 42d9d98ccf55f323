"""Every object key treadle writes under a root: the one place that spells them.

A project's objects live under its prefix, ``projects/<project>``; the functions below take
that prefix and return full keys (``media_key`` alone returns a project-relative key: it is
what a video column's index stores). :data:`LAYOUT` lists every kind of object with what it
holds; ``docs/storage.md`` and ``docs/ARCHITECTURE.md`` show :func:`describe`'s text, and a
test keeps both in step with it.
"""

from __future__ import annotations

MARKER = "treadle.json"
PROJECTS = "projects"
COMMITS = "commits"
REFS = "refs"
TAGS = "tags"
TABLES = "tables"
MEDIA = "media"
EPISODES = "episodes"
STATS = "stats"
RUNSTATS = "runstats"
GC_WRITERS = "gc/writers"
GC_USED = "gc/used"
GC_SWEEPS = "gc/sweeps"
EXPIRED = "retention/expired"
PENDING = "retention/pending"
PURGES = "purges"
MERGING = "running/merges"
PURGING = "running/purges"

LAYOUT: tuple[tuple[str, str], ...] = (
    (MARKER, "marker: this folder is a treadle store"),
    ("projects/<project>/commits/<sha256>.json", "immutable commits (content-addressed)"),
    ("projects/<project>/refs/<branch>/<seq:016d>.json", "write-once ref log; the highest seq is the head"),
    ("projects/<project>/tags/<tag>.json", "tags: a name for a commit, forever"),
    ("projects/<project>/tables/<table>.lance/", "one Lance dataset per table (branches share it)"),
    ("projects/<project>/media/<table>/<sha256>.h264", "video streams, one per episode and column"),
    ("projects/<project>/episodes/<table>/<data file>.json", "episode runs of one Lance fragment"),
    ("projects/<project>/stats/<table>/v<version>/<key>.json", "a column's statistics at a version"),
    ("projects/<project>/stats/<table>/v<version>/source.json", "statistics an import shipped"),
    ("projects/<project>/stats/<table>/v<version>/meta.json", "metadata and episode sets an import shipped"),
    ("projects/<project>/runstats/<run id>/<key>.json", "a run's statistics (Plan.stats)"),
    ("projects/<project>/gc/writers/<id>/", "leases of running writers (gc keeps what they stage)"),
    ("projects/<project>/gc/used/<object key>", "when a writer last reused an object"),
    ("projects/<project>/gc/sweeps/<id>/", "gc's own lease while it deletes"),
    ("projects/<project>/retention/pending/<commit>/<gc>.json", "commits a gc is expiring"),
    ("projects/<project>/retention/expired/<commit>.json", "commits retention expired"),
    ("projects/<project>/purges/<table>/<commit>.json", "a purge: episodes, reason, replaced versions"),
    ("projects/<project>/running/merges/<id>/", "leases of running merges (a purge waits for them)"),
    ("projects/<project>/running/purges/<table>/<id>/", "leases of running purges (merges refuse them)"),
)  # fmt: skip
"""``(key pattern, what it holds)`` for every kind of object, as the docs show them."""


def describe() -> str:
    """:data:`LAYOUT` as the docs' code block shows it (one ``<root>/`` key a line)."""
    width = max(len(p) for p, _ in LAYOUT) + len("<root>/") + 2
    return "\n".join(f"{'<root>/' + p:<{width}}{text}".rstrip() for p, text in LAYOUT)


def project_prefix(name: str) -> str:
    return f"{PROJECTS}/{name}"


def folder(prefix: str, kind: str) -> str:
    """The folder of one kind of a project's objects (``COMMITS``, ``GC_USED``, ...)."""
    return f"{prefix}/{kind}"


def under(prefix: str, key: str) -> str:
    """The full key of a project-relative ``key`` (a video column's ``media/...``)."""
    return f"{prefix}/{key}"


def commit_key(prefix: str, commit_id: str) -> str:
    return f"{prefix}/{COMMITS}/{commit_id}.json"


def ref_key(prefix: str, branch: str, seq: int) -> str:
    return f"{prefix}/{REFS}/{branch}/{seq:016d}.json"


def tag_key(prefix: str, name: str) -> str:
    return f"{prefix}/{TAGS}/{name}.json"


def table_key(prefix: str, name: str) -> str:
    """The folder of table ``name``'s Lance dataset (no trailing slash)."""
    return f"{prefix}/{TABLES}/{name}.lance"


def media_key(table: str, sha256: str, suffix: str = "") -> str:
    """Project-relative key of a video stream (``suffix``: a writer's own copy)."""
    return f"{MEDIA}/{table}/{sha256}{suffix}.h264"


def episodes_key(prefix: str, table: str, stem: str) -> str:
    return f"{prefix}/{EPISODES}/{table}/{stem}.json"


def stats_folder(prefix: str, table: str, version: int) -> str:
    return f"{prefix}/{STATS}/{table}/v{version}"


def source_stats_key(prefix: str, table: str, version: int) -> str:
    return f"{stats_folder(prefix, table, version)}/source.json"


def source_meta_key(prefix: str, table: str, version: int) -> str:
    return f"{stats_folder(prefix, table, version)}/meta.json"


def runstats_key(prefix: str, run_id: str, key: str) -> str:
    return f"{prefix}/{RUNSTATS}/{run_id}/{key}.json"


def retention_key(prefix: str, commit_id: str, pending: bool = False) -> str:
    """The expired marker of ``commit_id`` (``pending``: the one pending marker of an older
    treadle, which one gc could drop while another was still deciding: still read)."""
    return f"{prefix}/{PENDING if pending else EXPIRED}/{commit_id}.json"


def pending_folder(prefix: str, commit_id: str) -> str:
    """Where every gc deciding whether to expire ``commit_id`` keeps its pending marker."""
    return f"{prefix}/{PENDING}/{commit_id}"


def pending_key(prefix: str, commit_id: str, gc_id: str) -> str:
    """One gc's pending marker of ``commit_id`` (each gc its own: see catalog/expiry.py)."""
    return f"{pending_folder(prefix, commit_id)}/{gc_id}.json"


def purges_folder(prefix: str, table: str) -> str:
    """Where the records of every purge of table ``table`` live (catalog/purgemap.py)."""
    return f"{prefix}/{PURGES}/{table}"


def purge_key(prefix: str, table: str, commit_id: str) -> str:
    """The record of the purge of ``table`` committed as ``commit_id``."""
    return f"{purges_folder(prefix, table)}/{commit_id}.json"
