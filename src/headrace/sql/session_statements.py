"""Parsing the session-level statements: PREPARE / EXECUTE / DEALLOCATE, DECLARE / FETCH / CLOSE,
BEGIN / START TRANSACTION / COMMIT / END / ROLLBACK / ABORT, SET / RESET / DISCARD and COPY.

sqlglot turns most of these into opaque Commands, so they are parsed here by recursive descent
over sqlglot's own tokens (a tokenizer with no "command" keywords, so nothing is swallowed into a
string). The statements they wrap (PREPARE ... AS <stmt>, DECLARE ... FOR <query>, COPY (<query>))
are parsed by headrace.sql.parser.parse_statement, from their own slice of the text.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from headrace.errors import FeatureNotSupported, SyntaxError_
from headrace.sql.ast import (
    CloseCursor,
    CopyStatement,
    DeallocateStatement,
    DeclareCursor,
    DiscardStatement,
    ExecuteStatement,
    FetchCursor,
    PrepareStatement,
    ResetVariable,
    SavepointStatement,
    SetTransaction,
    SetVariable,
    SubscribeStatement,
)
from headrace.sql.parser import HeadraceTokenizer

StatementParser = Callable[[str], exp.Expr]

_SESSION_KEYWORDS = {"PREPARE", "EXECUTE", "DEALLOCATE", "DECLARE", "FETCH", "MOVE", "CLOSE", "SET", "RESET",
                     "DISCARD", "START", "BEGIN", "COMMIT", "END", "ROLLBACK", "ABORT", "COPY",
                     "SUBSCRIBE", "SAVEPOINT", "RELEASE"}
_STRING_TOKENS = (TokenType.STRING, TokenType.NATIONAL_STRING, TokenType.BYTE_STRING)


class _PlainTokenizer(HeadraceTokenizer):
    COMMANDS: set[TokenType] = set()  # PREPARE, DECLARE, RESET ... stay ordinary tokens


def parse_session_statement(sql: str, parse_statement: StatementParser) -> exp.Expr | None:
    """The statement's AST if it is a session-level statement, else None (not ours: let sqlglot
    parse it). `parse_statement` parses wrapped statements."""
    try:
        tokens = [token for token in _PlainTokenizer().tokenize(sql)]
    except TokenError:
        return None
    while tokens and tokens[-1].token_type == TokenType.SEMICOLON:
        tokens.pop()
    if not tokens or tokens[0].text.upper() not in _SESSION_KEYWORDS:
        return None
    return _Parser(sql, tokens, parse_statement).statement()


class _Parser:
    def __init__(self, sql: str, tokens: list[Token], parse_statement: StatementParser) -> None:
        self._sql = sql
        self._tokens = tokens
        self._index = 0
        self._parse_statement = parse_statement

    # --- token helpers ------------------------------------------------------------------------
    @property
    def _current(self) -> Token | None:
        return self._tokens[self._index] if self._index < len(self._tokens) else None

    def _peek_word(self, offset: int = 0) -> str:
        index = self._index + offset
        if index >= len(self._tokens):
            return ""
        token = self._tokens[index]
        return "" if token.token_type in (*_STRING_TOKENS, TokenType.IDENTIFIER) else token.text.upper()

    def _match(self, *words: str) -> bool:
        """Consume the keywords `words` in order if they are next."""
        if all(self._peek_word(offset) == word for offset, word in enumerate(words)):
            self._index += len(words)
            return True
        return False

    def _expect(self, *words: str) -> None:
        if not self._match(*words):
            self._error()

    def _advance(self) -> Token:
        token = self._current
        if token is None:
            raise SyntaxError_("syntax error at end of input", position=len(self._sql) + 1)
        self._index += 1
        return token

    def _error(self) -> None:
        token = self._current
        if token is None:
            raise SyntaxError_("syntax error at end of input", position=len(self._sql.rstrip().rstrip(";")) + 1)
        raise SyntaxError_(f'syntax error at or near "{token.text}"', position=token.start + 1)

    def _at_end(self) -> bool:
        return self._index >= len(self._tokens)

    def _end(self) -> None:
        if not self._at_end():
            self._error()

    def _name(self) -> str:
        """An identifier: unquoted ones fold to lower case, as PostgreSQL does."""
        token = self._advance()
        if token.token_type == TokenType.IDENTIFIER:
            return token.text
        if token.token_type in _STRING_TOKENS or not (token.text[:1].isalpha() or token.text[:1] == "_"):
            self._index -= 1
            self._error()
        return token.text.lower()

    def _string(self) -> str:
        token = self._advance()
        if token.token_type not in _STRING_TOKENS:
            self._index -= 1
            self._error()
        if token.token_type == TokenType.BYTE_STRING:  # E'...': decode C-style escapes from the source
            raw = self._sql[token.start:token.end + 1]
            body = raw[raw.index("'") + 1:-1].replace("''", "'")
            return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
        return token.text

    def _rest_sql(self) -> str:
        """The text from the current token to the end: a wrapped statement."""
        token = self._current
        if token is None:
            self._error()
        assert token is not None
        end = self._tokens[-1].end + 1
        self._index = len(self._tokens)
        return self._sql[token.start:end]

    # --- statements ---------------------------------------------------------------------------
    def statement(self) -> exp.Expr:
        keyword = self._advance().text.upper()
        parse = getattr(self, f"_parse_{keyword.lower()}")
        result: exp.Expr = parse()
        self._end()
        return result

    def _parse_prepare(self) -> exp.Expr:
        if self._peek_word() == "TRANSACTION":
            raise FeatureNotSupported("PREPARE TRANSACTION is not supported")
        name = self._name()
        param_types: list[str] = []
        if self._current is not None and self._current.token_type == TokenType.L_PAREN:
            self._advance()
            param_types.append(self._type_name())
            while self._current is not None and self._current.token_type == TokenType.COMMA:
                self._advance()
                param_types.append(self._type_name())
            self._close_paren()
        self._expect("AS")
        statement_sql = self._rest_sql()
        return PrepareStatement(this=name, param_types=param_types, statement=self._parse_statement(statement_sql),
                                statement_sql=statement_sql)

    def _type_name(self) -> str:
        """A type as written (e.g. `int`, `character varying`, `numeric(10, 2)`, `text[]`)."""
        start = self._current
        depth = 0
        while self._current is not None:
            kind = self._current.token_type
            if depth == 0 and kind in (TokenType.COMMA, TokenType.R_PAREN):
                break
            depth += kind == TokenType.L_PAREN
            depth -= kind == TokenType.R_PAREN
            self._advance()
        if start is None or self._current is start:
            self._error()
        assert start is not None
        return self._sql[start.start:self._tokens[self._index - 1].end + 1]

    def _close_paren(self) -> None:
        if self._current is None or self._current.token_type != TokenType.R_PAREN:
            self._error()
        self._advance()

    def _parse_execute(self) -> exp.Expr:
        name = self._name()
        params: list[exp.Expr] = []
        if self._current is not None and self._current.token_type == TokenType.L_PAREN:
            open_paren = self._advance()
            depth = 1
            while depth:
                token = self._advance()
                depth += (token.token_type == TokenType.L_PAREN) - (token.token_type == TokenType.R_PAREN)
            inner = self._sql[open_paren.end + 1:self._tokens[self._index - 1].start]
            select = self._parse_statement(f"SELECT {inner}")
            params = list(select.expressions)
        return ExecuteStatement(this=name, params=params)

    def _parse_deallocate(self) -> exp.Expr:
        self._match("PREPARE")
        if self._match("ALL"):
            return DeallocateStatement(this=None)
        return DeallocateStatement(this=self._name())

    def _parse_declare(self) -> exp.Expr:
        name = self._name()
        binary = False
        scroll: bool | None = None  # None: backward fetches allowed (PostgreSQL allows them where its plan can)
        while True:
            if self._match("BINARY"):
                binary = True
            elif self._match("ASENSITIVE") or self._match("INSENSITIVE"):
                pass
            elif self._match("NO", "SCROLL"):
                scroll = False
            elif self._match("SCROLL"):
                scroll = True
            else:
                break
        self._expect("CURSOR")
        hold = False
        if self._match("WITH", "HOLD"):
            hold = True
        else:
            self._match("WITHOUT", "HOLD")
        self._expect("FOR")
        statement_sql = self._rest_sql()
        return DeclareCursor(this=name, hold=hold, binary=binary, statement=self._parse_statement(statement_sql),
                             statement_sql=statement_sql, scroll=scroll)

    def _fetch_count(self) -> int:
        """FETCH's count: an integer, as PostgreSQL's grammar takes it (`FETCH 1.5 c` is a syntax error there)."""
        if not self._current.text.isdigit():  # type: ignore[union-attr]
            self._error()
        return int(self._advance().text)

    def _signed_count(self) -> int | None:
        """A signed integer count, when one is next (`FETCH -1`, `RELATIVE +2`)."""
        token = self._current
        if token is None:
            return None
        sign = 1
        if token.token_type in (TokenType.DASH, TokenType.PLUS):
            following = self._tokens[self._index + 1] if self._index + 1 < len(self._tokens) else None
            if following is None or following.token_type != TokenType.NUMBER:
                return None
            sign = -1 if token.token_type == TokenType.DASH else 1
            self._advance()
        elif token.token_type != TokenType.NUMBER:
            return None
        return sign * self._fetch_count()

    def _direction(self) -> tuple[str, int | None]:
        """FETCH / MOVE's direction and count (None: ALL), as PostgreSQL's grammar reads them."""
        if self._match("NEXT"):
            return "forward", 1
        if self._match("PRIOR"):
            return "backward", 1
        if self._match("FIRST"):
            return "absolute", 1
        if self._match("LAST"):
            return "absolute", -1
        for word in ("ABSOLUTE", "RELATIVE"):
            if self._match(word):
                count = self._signed_count()
                if count is None:
                    self._error()
                return word.lower(), count
        for word in ("FORWARD", "BACKWARD"):
            if self._match(word):
                if self._match("ALL"):
                    return word.lower(), None
                count = self._signed_count()
                return word.lower(), 1 if count is None else count
        if self._match("ALL"):
            return "forward", None
        count = self._signed_count()
        return "forward", 1 if count is None else count

    def _parse_move(self) -> exp.Expr:
        return self._parse_fetch(move=True)

    def _parse_fetch(self, move: bool = False) -> exp.Expr:
        direction, count = self._direction()
        if direction in ("forward", "backward") and count is not None and count < 0:  # FETCH -2: backward 2
            direction, count = "backward" if direction == "forward" else "forward", -count
        if not self._match("FROM"):
            self._match("IN")
        name = self._name()
        timeout: str | None = None
        if self._match("WITH"):
            if self._current is None or self._current.token_type != TokenType.L_PAREN:
                self._error()
            self._advance()
            option = self._name()
            if option != "timeout":
                raise SyntaxError_(f'unrecognized FETCH option "{option}"')
            if self._current is not None and self._current.token_type == TokenType.EQ:
                self._advance()
            token = self._advance()
            timeout = token.text
            self._close_paren()
        if move and timeout is not None:
            self._error()
        return FetchCursor(this=name, count=count, timeout=timeout, direction=direction, move=move)

    def _parse_close(self) -> exp.Expr:
        if self._match("ALL"):
            return CloseCursor(this=None)
        return CloseCursor(this=self._name())

    # --- transactions -------------------------------------------------------------------------
    def _transaction_modes(self) -> list[str]:
        modes: list[str] = []
        while not self._at_end():
            start = self._current
            assert start is not None
            while not self._at_end() and self._current is not None and self._current.token_type != TokenType.COMMA:
                self._advance()
            if self._current is start:  # a comma where a mode belongs (`BEGIN ,`, `BEGIN READ ONLY, ,`)
                raise SyntaxError_(f'syntax error at or near "{start.text}"')
            modes.append(" ".join(self._sql[start.start:self._tokens[self._index - 1].end + 1].lower().split()))
            if not self._at_end():
                self._advance()  # the comma
                if self._at_end():
                    raise SyntaxError_("syntax error at end of input")
        for mode in modes:
            if not (mode.startswith("isolation level ") or mode in ("read only", "read write", "deferrable",
                                                                     "not deferrable")):
                raise SyntaxError_(f'syntax error at or near "{mode.split()[0]}"')
        return modes

    def _parse_begin(self) -> exp.Expr:
        if not self._match("WORK"):
            self._match("TRANSACTION")
        return exp.Transaction(modes=self._transaction_modes() or None)

    def _parse_start(self) -> exp.Expr:
        self._expect("TRANSACTION")
        return exp.Transaction(modes=self._transaction_modes() or None)

    def _parse_commit(self) -> exp.Expr:
        if self._peek_word() == "PREPARED":
            raise FeatureNotSupported("COMMIT PREPARED is not supported")
        if not self._match("WORK"):
            self._match("TRANSACTION")
        if self._match("AND", "CHAIN"):
            raise FeatureNotSupported("COMMIT AND CHAIN is not supported")
        self._match("AND", "NO", "CHAIN")
        return exp.Commit()

    _parse_end = _parse_commit

    def _parse_rollback(self) -> exp.Expr:
        if self._peek_word() == "PREPARED":
            raise FeatureNotSupported(f"ROLLBACK {self._peek_word()} is not supported")
        if not self._match("WORK"):
            self._match("TRANSACTION")
        if self._match("TO"):
            self._match("SAVEPOINT")
            return SavepointStatement(this=self._name(), action="rollback_to")
        if self._match("AND", "CHAIN"):
            raise FeatureNotSupported("ROLLBACK AND CHAIN is not supported")
        self._match("AND", "NO", "CHAIN")
        return exp.Rollback()

    _parse_abort = _parse_rollback

    def _parse_savepoint(self) -> exp.Expr:
        return SavepointStatement(this=self._name(), action="savepoint")

    def _parse_release(self) -> exp.Expr:
        self._match("SAVEPOINT")
        return SavepointStatement(this=self._name(), action="release")

    # --- SUBSCRIBE ----------------------------------------------------------------------------
    def _parse_subscribe(self) -> exp.Expr:
        self._match("TO")
        args: dict[str, object] = {"snapshot": True, "progress": False, "as_of": None, "up_to": None}
        if self._current is not None and self._current.token_type == TokenType.L_PAREN:
            open_paren = self._advance()
            depth = 1
            while depth:
                token = self._advance()
                depth += (token.token_type == TokenType.L_PAREN) - (token.token_type == TokenType.R_PAREN)
            args["query_sql"] = self._sql[open_paren.end + 1:self._tokens[self._index - 1].start].strip()
            args["query"] = self._parse_statement(str(args["query_sql"]))
        else:
            name = self._dotted_name()
            schema, _, relation = name.rpartition(".")
            args["this"] = (schema.rpartition(".")[2], relation)
        if self._match("WITH"):
            if self._current is None or self._current.token_type != TokenType.L_PAREN:
                self._error()
            self._advance()
            while True:
                option = self._name()
                if option not in ("snapshot", "progress"):
                    raise SyntaxError_(f'unrecognized SUBSCRIBE option "{option}"')
                value = True
                if self._current is not None and self._current.token_type == TokenType.EQ:
                    self._advance()
                    value = self._value() in ("true", "on", "1", "t", "yes")
                args[option] = value
                if self._current is not None and self._current.token_type == TokenType.COMMA:
                    self._advance()
                    continue
                self._close_paren()
                break
        if self._match("AS", "OF"):
            args["as_of"] = self._timestamp()
        if self._match("UP", "TO"):
            args["up_to"] = self._timestamp()
        return SubscribeStatement(**args)

    def _timestamp(self) -> int:
        """AS OF / UP TO: a timestamp in ms since the epoch (a number, or a string holding one)."""
        text = self._value()
        try:
            return int(text)
        except ValueError:
            raise SyntaxError_(f'invalid SUBSCRIBE timestamp "{text}"',
                               hint="give milliseconds since the epoch, e.g. AS OF 1700000000000") from None

    # --- variables ----------------------------------------------------------------------------
    def _parse_set(self) -> exp.Expr:
        local = False
        if self._match("SESSION", "CHARACTERISTICS", "AS", "TRANSACTION"):
            return SetTransaction(modes=self._transaction_modes(), session=True)
        if self._match("LOCAL"):
            local = True
        else:
            self._match("SESSION")
        if self._match("TRANSACTION"):
            if self._match("SNAPSHOT"):
                raise FeatureNotSupported("SET TRANSACTION SNAPSHOT is not supported")
            return SetTransaction(modes=self._transaction_modes())
        if self._match("TIME", "ZONE"):
            name = "timezone"
        elif self._peek_word() in ("SESSION", "ROLE") and self._peek_word(1) in ("AUTHORIZATION", "NONE", "DEFAULT"):
            raise FeatureNotSupported(f"SET {self._peek_word()} is not supported")
        else:
            name = self._dotted_name()
            if self._current is None or (self._current.token_type != TokenType.EQ and not self._match("TO")):
                self._error()
            if self._current is not None and self._current.token_type == TokenType.EQ:
                self._advance()
        if self._match("DEFAULT") or (name == "timezone" and self._match("LOCAL")):
            return SetVariable(this=name, values=None, local=local)
        values = [self._value()]
        while self._current is not None and self._current.token_type == TokenType.COMMA:
            self._advance()
            values.append(self._value())
        return SetVariable(this=name, values=values, local=local)

    def _dotted_name(self) -> str:
        name = self._name()
        while self._current is not None and self._current.token_type == TokenType.DOT:
            self._advance()
            name += "." + self._name()
        return name

    def _value(self) -> str:
        """A SET value as PostgreSQL keeps it: strings as written, words lower-cased unless quoted,
        numbers (with a sign) as written."""
        token = self._current
        if token is None:
            self._error()
        assert token is not None
        if token.token_type in _STRING_TOKENS:
            return self._string()
        if token.token_type == TokenType.IDENTIFIER:
            return self._advance().text
        if token.token_type in (TokenType.DASH, TokenType.PLUS):
            self._advance()
            number = self._advance()
            if number.token_type != TokenType.NUMBER:
                self._index -= 1
                self._error()
            return ("-" if token.token_type == TokenType.DASH else "") + number.text
        if token.token_type == TokenType.NUMBER:
            return self._advance().text
        if token.token_type in (TokenType.COMMA, TokenType.L_PAREN, TokenType.R_PAREN, TokenType.SEMICOLON):
            self._error()
        return self._advance().text.lower()

    def _parse_reset(self) -> exp.Expr:
        if self._match("ALL"):
            return ResetVariable(this="all")
        if self._match("TIME", "ZONE"):
            return ResetVariable(this="timezone")
        if self._match("SESSION", "AUTHORIZATION") or self._match("ROLE"):
            raise FeatureNotSupported("RESET SESSION AUTHORIZATION / ROLE is not supported")
        return ResetVariable(this=self._dotted_name())

    def _parse_discard(self) -> exp.Expr:
        for what in ("ALL", "PLANS", "SEQUENCES", "TEMP", "TEMPORARY"):
            if self._match(what):
                return DiscardStatement(this="temp" if what == "TEMPORARY" else what.lower())
        self._error()
        raise AssertionError("unreachable")

    # --- COPY ---------------------------------------------------------------------------------
    def _parse_copy(self) -> exp.Expr:
        query: exp.Expr | None = None
        query_sql: str | None = None
        table: tuple[str, str] | None = None
        columns: list[str] = []
        if self._current is not None and self._current.token_type == TokenType.L_PAREN:
            open_paren = self._advance()
            depth = 1
            while depth:
                token = self._advance()
                depth += (token.token_type == TokenType.L_PAREN) - (token.token_type == TokenType.R_PAREN)
            query_sql = self._sql[open_paren.end + 1:self._tokens[self._index - 1].start].strip()
            query = self._parse_statement(query_sql)
        else:
            name = self._dotted_name()
            schema, _, relation = name.rpartition(".")
            if schema.count("."):
                schema = schema.rpartition(".")[2]
            table = (schema or "", relation)
            if self._current is not None and self._current.token_type == TokenType.L_PAREN:
                self._advance()
                columns.append(self._name())
                while self._current is not None and self._current.token_type == TokenType.COMMA:
                    self._advance()
                    columns.append(self._name())
                self._close_paren()
        if self._match("TO"):
            direction = "to"
            if not self._match("STDOUT"):
                raise FeatureNotSupported("COPY TO a file or program is not supported",
                                          hint="use COPY ... TO STDOUT (psql: \\copy)")
        elif self._match("FROM"):
            direction = "from"
            if query is not None:
                self._error()
            if not self._match("STDIN"):
                raise FeatureNotSupported("COPY FROM a file or program is not supported",
                                          hint="use COPY ... FROM STDIN (psql: \\copy)")
        else:
            self._error()
            raise AssertionError("unreachable")
        options = self._copy_options()
        return CopyStatement(query=query, query_sql=query_sql, table=table, columns=columns,
                             direction=direction, options=options)

    def _copy_options(self) -> dict[str, object]:
        options: dict[str, object] = {}
        self._match("WITH")
        if self._current is not None and self._current.token_type == TokenType.L_PAREN:
            self._advance()
            while True:
                name = self._advance().text.lower()
                if name in options:
                    raise SyntaxError_("conflicting or redundant options", sqlstate="42601")
                if self._current is not None and self._current.token_type == TokenType.L_PAREN:
                    self._advance()
                    listed = [self._name()]
                    while self._current is not None and self._current.token_type == TokenType.COMMA:
                        self._advance()
                        listed.append(self._name())
                    self._close_paren()
                    options[name] = listed
                elif self._current is not None and self._current.token_type == TokenType.STAR:
                    self._advance()
                    options[name] = "*"
                elif self._current is None or self._current.token_type in (TokenType.COMMA, TokenType.R_PAREN):
                    options[name] = True
                else:
                    options[name] = self._value()
                if self._current is not None and self._current.token_type == TokenType.COMMA:
                    self._advance()
                    continue
                self._close_paren()
                return options
        # PostgreSQL's pre-9.0 syntax (what psql's \copy passes through): BINARY, CSV HEADER, ...
        while not self._at_end():
            if self._match("BINARY"):
                options["format"] = "binary"
            elif self._match("CSV"):
                options["format"] = "csv"
            elif self._match("HEADER"):
                options["header"] = True
            elif self._peek_word() in ("DELIMITER", "NULL", "QUOTE", "ESCAPE"):
                name = self._advance().text.lower()
                self._match("AS")
                options[name] = self._string()
            elif self._match("FORCE", "QUOTE"):
                options["force_quote"] = "*" if self._current is not None and self._current.token_type == TokenType.STAR and self._advance() else self._name_list()
            elif self._match("FORCE", "NOT", "NULL"):
                options["force_not_null"] = self._name_list()
            else:
                self._error()
        return options

    def _name_list(self) -> list[str]:
        names = [self._name()]
        while self._current is not None and self._current.token_type == TokenType.COMMA:
            self._advance()
            names.append(self._name())
        return names
