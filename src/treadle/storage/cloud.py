"""Cloud roots (``s3://``, ``gs://``, ``az://``): options, credentials and obstore's client.

Storage options split into obstore's client options (HTTP settings) and the store's
config; Lance gets the same options, so both see one set of credentials.
"""

from __future__ import annotations

import math
import os
import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from obstore.store import from_url

from treadle.errors import CredentialsError, StorageError
from treadle.storage.store_errors import first_line

_CLIENT_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "timeout",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "http1_only",
    "http2_only",
    "proxy_url",
    "user_agent",
}
_SECRET_HINTS = ("secret", "key", "token", "password", "credential", "sas", "signature")
_CLOUD_SCHEMES = {"s3", "gs", "az", "abfs", "abfss", "azure"}
_ENV_PREFIX = {"s3": "AWS_", "gs": "GOOGLE_"} | dict.fromkeys(
    ("az", "abfs", "abfss", "azure"), "AZURE_"
)

_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` safe to print: anything that looks like a secret is masked.

    That is every value of a key that names a secret, and the ``user:password@`` part of
    any URL value (``proxy_url="http://user:pw@proxy:3128"``).
    """
    out: dict[str, Any] = {}
    for k, v in (options or {}).items():
        lk = k.lower()
        secret = any(h in lk for h in _SECRET_HINTS) and "region" not in lk
        out[k] = "***" if secret else _URL_USERINFO.sub("***@", v) if isinstance(v, str) else v
    return out


def shown_root(root: str) -> str:
    """``root`` safe to print: a ``user:password@`` part and a query (a SAS token, a
    presigned signature) masked."""
    shown = _URL_USERINFO.sub(lambda m: "***@" if ":" in m.group(0) else m.group(0), root)
    return shown.split("?", 1)[0] + "?***" if "?" in shown else shown


def check_root_url(root: str) -> None:
    """Refuse a URL root that carries credentials (``user:password@``, a ``?query`` such as
    an Azure SAS token): a root is printed, logged and stored in run records and cards,
    and treadle never reads credentials from it. ``abfs://container@account...`` (no
    password) is a container, not a credential."""
    parts = urlsplit(root)
    if ":" in parts.netloc.rpartition("@")[0] or parts.query or parts.fragment:
        raise StorageError(
            f"root {shown_root(root)!r} carries credentials or a query in its URL: give the "
            "bare URL, and credentials in storage_options or the environment (a root is "
            "printed and stored, so it may not hold a secret)"
        )


def _option_value(v: Any) -> str:
    """A storage option value as object_store and Lance parse it (``True`` -> ``"true"``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    text = str(v)
    low = text.strip().lower()
    if low in ("true", "yes", "on", "false", "no", "off"):
        return "true" if low in ("true", "yes", "on") else "false"
    return text


def _as_bool(v: Any) -> bool:
    return str(v).lower() in {"1", "true", "yes", "on"}


def open_cloud(root: str, scheme: str, options: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """Open a cloud root with obstore: the inner store and the options Lance opens it with.

    Without credentials for ``s3://`` this raises :class:`CredentialsError` before any
    request is made; obstore's own failures (an unknown key) are :class:`StorageError`.
    """
    if not urlsplit(root).netloc:  # s3:/bucket (one slash): object_store cannot parse it
        raise StorageError(
            f"root {shown_root(root)!r} names no bucket: an object-store root is "
            f"{scheme}://BUCKET/PREFIX"
        )
    if scheme == "s3":
        _require_s3_credentials(root, options)
    if _ENV_PREFIX.get(scheme) == "AZURE_":
        _refuse_emulator_with_endpoint(root, options)
    retry_s = retry_timeout(options, scheme)
    options = {k: v for k, v in options.items() if k.lower() != "retry_timeout"}
    client = {k: _option_value(v) for k, v in options.items() if k.lower() in _CLIENT_KEYS}
    config = {k: _option_value(v) for k, v in options.items() if k.lower() not in _CLIENT_KEYS}
    # obstore ignores the environment's client settings (AWS_ALLOW_HTTP=true, ...) once
    # client_options are passed, so they are read here the way object_store's from_env would
    given = {k.lower() for k in client}
    for key in _CLIENT_KEYS - given:
        value = os.environ.get(_ENV_PREFIX.get(scheme, "AWS_") + key.upper())
        if value is not None:
            client[key] = _option_value(value)
    _refuse_http_without_allow_http(root, scheme, config, client)
    if scheme == "s3" and any(k.lower() in ("aws_endpoint", "endpoint") for k in config):
        config.setdefault("aws_virtual_hosted_style_request", "false")
    retry = {
        "max_retries": 8,
        "backoff": {
            "init_backoff": timedelta(milliseconds=50),
            "max_backoff": timedelta(seconds=5),
            "base": 2.0,
        },
        "retry_timeout": timedelta(seconds=retry_s),
    }
    try:
        inner = from_url(root.rstrip("/"), config=config, client_options=client, retry_config=retry)
    except Exception as e:  # obstore raises on unknown keys etc.; never echo values
        raise StorageError(f"cannot open {root!r}: {type(e).__name__}: {first_line(e)}") from None
    lance_options = {k: _option_value(v) for k, v in options.items()}
    if "allow_http" in client:
        lance_options["allow_http"] = client["allow_http"]
    _bound_lance_requests(lance_options, scheme, retry_s)
    return inner, lance_options


RETRY_TIMEOUT_S = 60.0
"""How long one call to a cloud store retries (a store that never answers: a request waits
``timeout``, 30 s, so two tries) where neither the storage option ``retry_timeout`` nor
``<AWS_|AZURE_|GOOGLE_>RETRY_TIMEOUT`` says (obstore's ``retry_timeout``)."""
REQUEST_TIMEOUT_S = 30.0
"""How long one request waits (obstore's default ``timeout``; treadle gives Lance the same)."""


def retry_timeout(options: dict[str, Any], scheme: str) -> float:
    """Seconds of the ``retry_timeout`` storage option (``"90"``, ``"90s"``, ``"2m"``), else
    of the environment's ``<prefix>RETRY_TIMEOUT``, else :data:`RETRY_TIMEOUT_S`."""
    got = _seconds(options, scheme, "retry_timeout")
    if got is None:
        return RETRY_TIMEOUT_S
    if isinstance(got, str):
        raise StorageError(f"{got}: give seconds (e.g. 60 or 60s, or 2m)")
    return got


def _seconds(options: dict[str, Any], scheme: str, key: str) -> float | str | None:
    """Seconds of storage option ``key``, else of ``<prefix><KEY>`` in the environment;
    None if neither is set; what is wrong with it (a text) if it is no positive duration."""
    given = next((v for k, v in options.items() if k.lower() == key), None)
    name = f"storage option {key!r}"
    if given is None:
        env = _ENV_PREFIX.get(scheme, "AWS_") + key.upper()
        given, name = os.environ.get(env), f"environment variable {env}"
    if given is None:
        return None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m)?\s*", str(given))
    if m is None or float(m.group(1)) <= 0:
        return f"{name} is {given!r}"
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2) or "s"]


#: Lance's client settings where neither an option nor the environment gives one: without a
#: request timeout Lance waited forever on a server that stalled mid-body (a loader hung)
_LANCE_CLIENT_DEFAULTS = {
    "timeout": "30s",
    "connect_timeout": "5s",
    "client_max_retries": "8",
}


def _bound_lance_requests(lance_options: dict[str, str], scheme: str, retry_s: float) -> None:
    given = {k.lower() for k in lance_options}
    prefix = _ENV_PREFIX.get(scheme, "AWS_")
    # Lance tries a read again itself (4 tries of a stalled read, 6 of a listing, measured
    # with pylance 14): its client retries each request for at most one request's timeout,
    # so a store that never answers costs one wait per Lance try, not retry_timeout each
    request_s = _seconds(lance_options, scheme, "timeout")
    request_s = request_s if isinstance(request_s, float) else REQUEST_TIMEOUT_S
    retry = {"client_retry_timeout": str(max(1, math.ceil(min(retry_s, request_s))))}
    for key, value in (_LANCE_CLIENT_DEFAULTS | retry).items():
        if key not in given:  # Lance may not read the environment's client settings
            lance_options[key] = os.environ.get(prefix + key.upper(), value)


_ENDPOINT_KEYS = ("endpoint", "endpoint_url")


def _refuse_http_without_allow_http(
    root: str, scheme: str, config: dict[str, str], client: dict[str, str]
) -> None:
    """object_store refuses every request to an ``http://`` endpoint unless ``allow_http``
    is set, with only "HTTP error: builder error": say so, and what to set, up front."""
    if _as_bool(next((v for k, v in client.items() if k.lower() == "allow_http"), "")):
        return
    prefix = _ENV_PREFIX.get(scheme, "AWS_")
    endpoints = [v for k, v in config.items() if k.lower().endswith(_ENDPOINT_KEYS)]
    endpoints += [
        v for k, v in os.environ.items() if k.startswith(prefix) and k.endswith("_ENDPOINT")
    ] + [os.environ.get(f"{prefix}ENDPOINT_URL", "")]
    http = next((e for e in endpoints if e.strip().lower().startswith("http://")), None)
    if http is not None:
        raise StorageError(
            f"cannot open {root!r}: its endpoint {_URL_USERINFO.sub('***@', http)!r} is plain http, which the object "
            "store refuses unless allowed: set allow_http=true (storage_options="
            "{'allow_http': 'true'}, --storage-option allow_http=true, or "
            f"{prefix}ALLOW_HTTP=true)"
        )


def _refuse_emulator_with_endpoint(root: str, options: dict[str, Any]) -> None:
    """object_store's Azure emulator mode sends every request to ``$AZURITE_BLOB_STORAGE_URL``
    (default 127.0.0.1:10000) whatever the endpoint says: refuse the pair rather than talk
    to another server than the one named."""
    given = {k.lower(): v for k, v in options.items()}
    env = os.environ
    emulator = next(
        (given[k] for k in ("azure_storage_use_emulator", "use_emulator") if k in given),
        env.get("AZURE_STORAGE_USE_EMULATOR", ""),
    )
    endpoint = any(k in given for k in ("azure_storage_endpoint", "azure_endpoint", "endpoint"))
    if _as_bool(emulator) and (endpoint or env.get("AZURE_STORAGE_ENDPOINT")):
        raise StorageError(
            f"cannot open {root!r}: azure_storage_use_emulator ignores azure_storage_endpoint "
            "(every request would go to $AZURITE_BLOB_STORAGE_URL or 127.0.0.1:10000); give "
            "the endpoint (http://HOST:PORT/ACCOUNT) with allow_http, without use_emulator"
        )


def _require_s3_credentials(root: str, options: dict[str, Any]) -> None:
    keys = {k.lower() for k in options}
    if _as_bool(options.get("skip_signature", options.get("aws_skip_signature", False))):
        return
    if {"aws_access_key_id", "aws_secret_access_key"} <= keys or {
        "access_key_id",
        "secret_access_key",
    } <= keys:
        return
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return
    if any(
        env.get(v)
        for v in (
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    ):
        return
    raise CredentialsError(
        f"no credentials for {root!r}: pass storage_options={{'aws_access_key_id': ..., "
        "'aws_secret_access_key': ...} (--storage-option aws_access_key_id=... "
        "--storage-option aws_secret_access_key=... on the command line) or set "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or skip_signature='true' for a public bucket)"
    )


def _place_name(key: str) -> str | None:
    """``endpoint``, ``account`` or ``emulator`` for a key (option or environment variable,
    lower case, without its prefix) that says where a bucket is; None for any other."""
    if "key" in key or "secret" in key or "token" in key:
        return None
    if "endpoint" in key:
        return "endpoint"
    return "account" if "account_name" in key else "emulator" if "use_emulator" in key else None


def store_place(root: str, scheme: str, options: dict[str, Any]) -> str:
    """``root`` and the endpoint/account its options or environment name (never a secret):
    what tells two stores apart whose URLs are the same (``s3://b`` on AWS and on MinIO,
    ``az://c`` of two accounts). Caches and the one-store checks key by it."""
    prefix = _ENV_PREFIX.get(scheme, "AWS_")
    place: dict[str, str] = {}
    env = {k[len(prefix) :]: v for k, v in os.environ.items() if k.startswith(prefix)}
    for source in (options, env):  # an option wins over the environment (object_store's order)
        for k, v in source.items():
            name = _place_name(str(k).lower())
            value = str(v).strip().rstrip("/").lower()
            if name == "emulator" and not _as_bool(value):
                continue
            if name is not None and value and name not in place:
                place[name] = _URL_USERINFO.sub("***@", value)
    if "emulator" in place:  # every request goes to Azurite's URL (see above)
        place["emulator"] = os.environ.get("AZURITE_BLOB_STORAGE_URL", "127.0.0.1:10000").lower()
    shown = ", ".join(f"{k}={v}" for k, v in sorted(place.items()))
    return f"{root} ({shown})" if shown else root
