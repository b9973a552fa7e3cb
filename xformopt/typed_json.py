"""Hold a JSON document xformopt writes to the type that describes it (a ``TypedDict``): the pass records
(``passes/records.py``) and the report (``report/types.py``).

The dict stays the wire format and the ``TypedDict`` is its schema, checked with pydantic. Tests run with
``XFORMOPT_STRICT_RECORDS=1`` (tests/conftest.py), where a key or a value type the type does not declare
raises; elsewhere it is logged, never fatal for a user's run (a schema slip must never cost a user the
artifact a long run built).
"""

from __future__ import annotations

import logging
import os

from pydantic import TypeAdapter, ValidationError

STRICT_ENV = "XFORMOPT_STRICT_RECORDS"

_ADAPTERS: dict[object, TypeAdapter] = {}


def type_errors(doc_type, doc) -> list[str]:
    """Where ``doc`` departs from ``doc_type``: one line per key (undeclared, missing, wrong type)."""
    adapter = _ADAPTERS.get(doc_type)
    if adapter is None:
        adapter = _ADAPTERS[doc_type] = TypeAdapter(doc_type)
    try:
        adapter.validate_python(doc, strict=False)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()]
    return []


def check_typed(what: str, doc_type, doc, logger: logging.Logger) -> None:
    """Raise a TypeError naming every departure under ``XFORMOPT_STRICT_RECORDS=1``, else log a warning."""
    errors = type_errors(doc_type, doc)
    if not errors:
        return
    message = f"{what} its type {getattr(doc_type, '__name__', doc_type)} does not describe: " + "; ".join(errors)
    if os.environ.get(STRICT_ENV) == "1":
        raise TypeError(message)
    logger.warning(message)
