from __future__ import annotations

import pytest

from headrace.coordinator.responses import StatementDescription
from headrace.coordinator.session import PreparedStatement, Session, TransactionStatus, default_variables
from headrace.errors import ProtocolViolation, UndefinedCursor, UndefinedPreparedStatement


def new_session() -> Session:
    return Session(user="headrace", database="headrace", variables=default_variables("headrace", "headrace", "test"))


def statement(params: int = 0) -> PreparedStatement:
    return PreparedStatement(sql="SELECT 1", ast=None, description=StatementDescription((25,) * params, None))


def test_unnamed_statement_survives_sync_unnamed_portal_does_not() -> None:
    session = new_session()
    session.statements[""] = statement()
    session.begin()
    session.set_portal("", session.get_statement(""), [])
    session.set_portal("named", session.get_statement(""), [])
    session.end_of_batch()
    assert session.get_statement("") is not None
    assert session.get_portal("named") is not None  # inside a transaction block
    with pytest.raises(UndefinedCursor):
        session.get_portal("")
    session.end_transaction(committed=True)
    with pytest.raises(UndefinedCursor):
        session.get_portal("named")  # a portal lasts until the end of its transaction


def test_missing_names_and_parameter_count() -> None:
    session = new_session()
    with pytest.raises(UndefinedPreparedStatement):
        session.get_statement("nope")
    with pytest.raises(ProtocolViolation, match="supplies 1 parameters, but prepared statement requires 2"):
        session.set_portal("", statement(params=2), [1])


def test_failed_transaction_only_inside_a_block() -> None:
    session = new_session()
    session.fail_transaction()
    assert session.transaction is TransactionStatus.IDLE
    session.transaction = TransactionStatus.IN_BLOCK
    session.fail_transaction()
    assert session.transaction is TransactionStatus.FAILED


def test_startup_variables_are_what_clients_check() -> None:
    variables = default_variables("u", "headrace", "psql")
    assert int(variables["server_version"].split(".")[0]) >= 12
    assert (variables["client_encoding"], variables["datestyle"], variables["integer_datetimes"],
            variables["standard_conforming_strings"]) == ("UTF8", "ISO, MDY", "on", "on")
