"""Request-body validation errors shaped like FastAPI/pydantic's, as the engines report them.

Both engines parse OpenAI bodies with pydantic v2 in lax mode (numeric strings are
numbers, 0/1 are booleans, unknown fields are ignored) and turn FastAPI's
RequestValidationError into a 400 — never a 422 (WIRE_SPEC §5):

- vLLM: message `"{N} validation error(s):\\n  {err}\\n  {err}"`, each `err` the repr of a
  sanitised error dict whose `loc` is a dotted string (`'body.messages'`) and whose `input`
  is summarised (`'<dict of 1 items>'`); `param` = the first error's loc; type "Bad Request".
- SGLang: `str(exc) + " " + str(exc.errors())` with tuple locs (`('body', 14)`) and raw
  inputs; `param` null. (The endpoint context lines newer FastAPI appends are left out.)

Only the checks a gateway can trip are modelled: body not an object, missing required
fields, wrong scalar and list types. Anything subtler is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldError:
    type: str
    loc: tuple[str | int, ...]  # ("body", "messages")
    msg: str
    input: Any
    ctx: dict[str, Any] | None = None


class ApiError(Exception):
    """An error answer: status, message, OpenAI error `type` and `param`."""

    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param


class SchemaError(Exception):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(f"{len(errors)} validation errors")
        self.errors = errors


def _summary(value: Any) -> Any:
    if isinstance(value, Mapping):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return value


def _header(n: int) -> str:
    return f"{n} validation error{'s' if n != 1 else ''}:"


def vllm_error(exc: SchemaError) -> ApiError:
    dicts = []
    for e in exc.errors:
        d: dict[str, Any] = {
            "type": e.type,
            "loc": ".".join(str(p) for p in e.loc),
            "msg": e.msg,
            "input": _summary(e.input),
        }
        if e.ctx is not None:
            d["ctx"] = e.ctx
        dicts.append(d)
    lines = "\n".join(f"  {d!r}" for d in dicts)
    param = str(dicts[0]["loc"]) if dicts else None
    return ApiError(400, f"{_header(len(dicts))}\n{lines}", "Bad Request", param)


def sglang_error(exc: SchemaError) -> ApiError:
    dicts = []
    for e in exc.errors:
        d: dict[str, Any] = {"type": e.type, "loc": e.loc, "msg": e.msg, "input": e.input}
        if e.ctx is not None:
            d["ctx"] = e.ctx
        dicts.append(d)
    lines = "\n".join(f"  {d!r}" for d in dicts)
    return ApiError(400, f"{_header(len(dicts))}\n{lines} {dicts!r}", "Bad Request", None)


# -- lax pydantic coercions ----------------------------------------------------------------


class _Invalid(Exception):
    def __init__(self, type_: str, msg: str) -> None:
        self.type = type_
        self.msg = msg


def _int(v: Any) -> int:
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise _Invalid(
            "int_from_float", "Input should be a valid integer, got a number with a fractional part"
        )
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise _Invalid(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            ) from None
    raise _Invalid("int_type", "Input should be a valid integer")


def _float(v: Any) -> float:
    if isinstance(v, bool | int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            raise _Invalid(
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            ) from None
    raise _Invalid("float_type", "Input should be a valid number")


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in _TRUE | _FALSE:
        return v.lower() in _TRUE
    raise _Invalid("bool_parsing", "Input should be a valid boolean, unable to interpret input")


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise _Invalid("string_type", "Input should be a valid string")


def _list(v: Any) -> list[Any]:
    if isinstance(v, list):
        return v
    raise _Invalid("list_type", "Input should be a valid list")


def _dict(v: Any) -> dict[str, Any]:
    if isinstance(v, dict):
        return v
    raise _Invalid("dict_type", "Input should be a valid dictionary")


COERCE: dict[str, Callable[[Any], Any]] = {
    "int": _int,
    "float": _float,
    "bool": _bool,
    "str": _str,
    "list": _list,
    "dict": _dict,
}


def check(
    body: Any,
    fields: Mapping[str, tuple[str, bool]],
    *,
    list_items: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Coerce `body`'s known fields; unknown ones pass through. Raises SchemaError.

    `fields` maps a name to (kind, required); null is accepted for optional fields.
    `list_items` names list fields whose items must be of a kind (e.g. messages → dict).
    """
    if not isinstance(body, dict):
        raise SchemaError(
            [
                FieldError(
                    "model_attributes_type",
                    ("body",),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    out = dict(body)
    errors: list[FieldError] = []
    for name, (kind, required) in fields.items():
        if name not in body:
            if required:
                errors.append(FieldError("missing", ("body", name), "Field required", body))
            continue
        value = body[name]
        if value is None and not required:
            continue
        try:
            out[name] = COERCE[kind](value)
        except _Invalid as bad:
            errors.append(FieldError(bad.type, ("body", name), bad.msg, value))
            continue
        item_kind = (list_items or {}).get(name)
        if item_kind is not None:
            for i, item in enumerate(out[name]):
                try:
                    COERCE[item_kind](item)
                except _Invalid as bad:
                    errors.append(FieldError(bad.type, ("body", name, i), bad.msg, item))
    if errors:
        raise SchemaError(errors)
    return out
