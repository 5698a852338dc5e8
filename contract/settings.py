"""How every lowwater role (agent, job, API) reads its settings: one pydantic-settings model per role.

Precedence, lowest first: the model's defaults < a settings file (YAML, ``--settings FILE``) <
environment variables ``LOWWATER_<ROLE>_<FIELD>`` (nested: ``LOWWATER_JOB_KAFKA_SECURITY__PROTOCOL``;
mappings and lists as JSON) < command-line flags. Each role's CLI hands only the flags the user gave
to :func:`load`, so a default never hides an environment variable. Unknown keys and bad values are
refused with where they came from: ``lowwater-job: settings: kafka_security.protocol: Input should
be 'PLAINTEXT', 'SSL', ... (LOWWATER_JOB_KAFKA_SECURITY__PROTOCOL or --settings)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_FILE: ContextVar[dict[str, Any] | None] = ContextVar("lowwater_settings_file", default=None)


def role_parser(prog: str, what: str, role: str) -> argparse.ArgumentParser:
    """A role's command line with the flags its settings share with the other roles: ``--settings``,
    ``--config`` and ``--query``; ``role`` names its environment variables (``LOWWATER_<ROLE>_<FLAG>``)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"{what}. Every flag can also be set as LOWWATER_{role}_<FLAG> or in --settings FILE.",
    )
    p.add_argument("--settings", help="YAML file of settings (field names as the flags, with _)")
    p.add_argument("--config", help="queries YAML (default configs/default.yaml)")
    p.add_argument(
        "--query", dest="queries", action="append", help="run only these queries (repeatable; default: all)"
    )
    return p


class SettingsError(ValueError):
    """Settings that do not validate: the message names the setting, the reason and its sources."""


class _FileSource(PydanticBaseSettingsSource):
    """The parsed settings file of the current :func:`load` call (below the environment)."""

    def get_field_value(
        self, field: Any, field_name: str
    ) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE.get() or {})


class RoleSettings(BaseSettings):
    """Base of the per-role models; a subclass sets ``env_prefix`` (``LOWWATER_AGENT_`` ...)."""

    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", env_ignore_empty=True, validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)


S = TypeVar("S", bound=RoleSettings)


def read_file(path: str | Path) -> dict[str, Any]:
    """A settings file: a YAML mapping of field names (``SettingsError`` with file and line otherwise)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SettingsError(f"{p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise SettingsError(f"{where}: not YAML: {getattr(exc, 'problem', exc)}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SettingsError(f"{p}: a settings file is a mapping of setting names, got {type(doc).__name__}")
    return doc


def load(cls: type[S], flags: Mapping[str, Any], settings_file: str | Path | None = None) -> S:
    """The role's settings from defaults, ``settings_file``, the environment and ``flags`` (given ones only)."""
    token = _FILE.set(read_file(settings_file) if settings_file else None)
    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        prefix = cls.model_config.get("env_prefix", "")
        lines = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()))
            env = prefix + "__".join(str(x) for x in e.get("loc", ())).upper()
            lines.append(
                f"{loc}: {e.get('msg')} (flag, {env}{' or ' + str(settings_file) if settings_file else ''})"
            )
        raise SettingsError("; ".join(lines)) from None
    finally:
        _FILE.reset(token)
