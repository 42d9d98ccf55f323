"""Which setting a cloud root's credentials came from: named (never shown) when the
store refuses a request, so that an expired token says which setting to renew."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

# the option names object_store takes for a credential (lower case, without a prefix)
_SAS = ("azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token")
_SECRETS = (
    "aws_secret_access_key",
    "secret_access_key",
    "aws_session_token",
    "session_token",
    "aws_token",
    "azure_storage_account_key",
    "azure_storage_access_key",
    "account_key",
    "access_key",
    "azure_client_secret",
    "client_secret",
    "azure_storage_token",
    "bearer_token",
    "google_service_account_key",
    "google_service_account",
    "google_application_credentials",
    "service_account_key",
    "service_account",
)
_ENV = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_", "abfs": "AZURE_", "abfss": "AZURE_"}


@dataclass(frozen=True)
class Credentials:
    """Where a root's credentials came from: ``setting`` (``storage_options 'x'`` or
    ``environment variable X``), and a SAS token's signed expiry (``se=``, no secret)."""

    setting: str
    sas: bool = False
    expiry: datetime | None = None

    def advice(self, now: datetime | None = None) -> str:
        """What to check when the store refused a request, naming the setting."""
        if not self.sas:
            return f"check the credentials given in {self.setting}"
        now = now or datetime.now(UTC)
        if self.expiry is not None and self.expiry <= now:
            return (
                f"the SAS token given in {self.setting} expired at "
                f"{self.expiry:%Y-%m-%dT%H:%M:%SZ}: give a new one"
            )
        until = "" if self.expiry is None else f", valid until {self.expiry:%Y-%m-%dT%H:%M:%SZ}"
        return (
            f"check the SAS token given in {self.setting}{until}: it may have expired "
            "(by the store's clock) or lack a permission (sp=) or a service (ss=)"
        )


def advice(credentials: Credentials | None) -> str:
    """:meth:`Credentials.advice`, or "" where nothing names the credentials."""
    return "" if credentials is None else credentials.advice()


def _expiry(sas: str) -> datetime | None:
    se = parse_qs(sas.lstrip("?")).get("se", [""])[0]
    try:
        return datetime.fromisoformat(se.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def credentials_of(scheme: str, options: dict[str, Any]) -> Credentials | None:
    """Where ``options`` (else the environment) give a root's credentials; None if neither
    names one (an instance role, a profile, anonymous access)."""
    given = {str(k).lower(): (str(k), v) for k, v in options.items()}
    for names, sas in ((_SAS, True), (_SECRETS, False)):
        for name in names:
            for key in (name, f"{_ENV.get(scheme, 'AWS_').lower()}{name}"):
                if key in given and str(given[key][1]):
                    shown, value = given[key]
                    setting = f"storage_options {shown!r} (--storage-option on the command line)"
                    return Credentials(setting, sas, _expiry(str(value)))
    prefix = _ENV.get(scheme, "AWS_")
    for names, sas in ((_SAS, True), (_SECRETS, False)):
        for name in names:
            var = name.upper() if name.startswith(prefix.lower()) else prefix + name.upper()
            if os.environ.get(var):
                return Credentials(f"environment variable {var}", sas, _expiry(os.environ[var]))
    return None
