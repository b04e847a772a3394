"""constant_time_eq_any and string_to_array in CHECK expressions: what the sender recipes need to
accept any of several signatures (key rotation). string_to_array's results are PostgreSQL 15's
(`SELECT string_to_array(...)` on PostgreSQL 15, hard-coded)."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.errors import HeadraceError
from headrace.sql.expr import SqlType, compile_expression

COLUMNS = {"headers": SqlType.MAP, "key": SqlType.TEXT}
ROW: dict[str, Any] = {"headers": {"webhook-signature": "v1,old v1,new v1a,asym", "single": "v1,new"}, "key": "v1,new"}


def evaluate(sql: str) -> Any:
    return compile_expression(sql, COLUMNS)(ROW)


@pytest.mark.parametrize(("sql", "expected"), [
    ("string_to_array('a,b,,c', ',')", ["a", "b", "", "c"]),  # PostgreSQL: {a,b,"",c}
    ("string_to_array('', ',')", []),  # {}
    ("string_to_array('a,b', '')", ["a,b"]),  # {a,b} as one element
    ("string_to_array('t=1,v1=x', ',')", ["t=1", "v1=x"]),
    ("string_to_array(headers['missing'], ' ')", None),
    ("constant_time_eq_any(string_to_array(headers['webhook-signature'], ' '), key)", True),  # the second one
    ("constant_time_eq_any(string_to_array(headers['webhook-signature'], ' '), 'v1,other')", False),
    ("constant_time_eq_any(string_to_array(headers['single'], ' '), key)", True),
    ("constant_time_eq_any(string_to_array('', ' '), key)", False),
    ("constant_time_eq_any(string_to_array(headers['missing'], ' '), key)", None),
    ("constant_time_eq_any(regexp_match('v1=ab', 'v1=(..)'), 'ab')", True),
])
def test_values(sql: str, expected: Any) -> None:
    assert evaluate(sql) == expected


def test_types_are_checked() -> None:
    with pytest.raises(HeadraceError, match=r"constant_time_eq_any\(text, text\) does not exist"):
        compile_expression("constant_time_eq_any(key, key)", COLUMNS)
