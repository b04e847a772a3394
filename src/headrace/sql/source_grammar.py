"""Grammar of webhook sources and secrets, as a sqlglot parser mixin (HeadraceParser inherits it):

    CREATE SOURCE [IF NOT EXISTS] <name> FROM WEBHOOK BODY FORMAT TEXT | JSON | JSON ARRAY | BYTES
      [INCLUDE HEADER '<h>' AS <col> [BYTES], ...] [INCLUDE HEADERS [([NOT] '<h>', ...)]]
      [CHECK ( [WITH (BODY [AS a] [BYTES], HEADERS [AS a], SECRET <s> [AS a] [BYTES], ...)] <expr> )]
      [IDEMPOTENT (<expr>) [WINDOW '<interval>']]
    ALTER SOURCE [IF EXISTS] <name> SET (WINDOW [=] '<interval>')
    CREATE SECRET [IF NOT EXISTS] <name> AS <expr>;  ALTER SECRET [IF EXISTS] <name> AS <expr>
    DROP SECRET [IF EXISTS] <name> [, ...] [CASCADE | RESTRICT]

Expressions are kept as the text the user wrote (sliced from the statement), so the stored
definition and SHOW CREATE read like the input; they are compiled by sql/expr.py when used.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import TokenType

from headrace.sql.ast import AlterSourceWindow, CreateSecret, CreateWebhookSource, DropObject

_FORMATS = {"TEXT": "text", "JSON": "json", "BYTES": "bytes"}


class WebhookGrammar(Postgres.Parser):
    # ---- helpers ------------------------------------------------------------------------------
    def _expression_text(self) -> str:
        """Parse one scalar expression and return its text as written."""
        first = self._curr
        expression = self._parse_assignment()
        if expression is None or first is None or self._prev is None:
            self.raise_error("Expected an expression")
            return ""
        return self.sql[first.start : self._prev.end + 1]

    def _wrapped_expression_text(self) -> str:
        self._expect(TokenType.L_PAREN, "(")
        text = self._expression_text()
        self._expect(TokenType.R_PAREN, ")")
        return text

    def _expect(self, token_type: TokenType, shown: str) -> None:
        if not self._match(token_type):
            self.raise_error(f"Expected {shown}")

    def _string_literal(self, what: str) -> str:
        if not self._match(TokenType.STRING):
            self.raise_error(f"Expected {what} as a string literal")
            return ""
        return self._prev.text

    def _identifier(self, what: str) -> str:
        identifier = self._parse_id_var(any_token=False)
        if not isinstance(identifier, exp.Identifier):
            self.raise_error(f"Expected {what}")
            return ""
        return identifier.name if identifier.args.get("quoted") else identifier.name.lower()

    def _dotted_name(self, what: str) -> str:
        parts = [self._identifier(what)]
        while self._match(TokenType.DOT):
            parts.append(self._identifier(what))
        return ".".join(parts)

    def _at_end(self) -> bool:
        return self._curr is None or self._curr.token_type in (TokenType.SEMICOLON, TokenType.SENTINEL)

    # ---- CREATE SOURCE ------------------------------------------------------------------------
    def _parse_create_source(self) -> CreateWebhookSource:
        if_not_exists = bool(self._match_text_seq("IF", "NOT", "EXISTS"))
        name = self._parse_table_parts()
        if self._match_text_seq("IN", "CLUSTER"):
            self._identifier("a cluster name")  # accepted for Materialize compatibility; one cluster here
        if not self._match_text_seq("FROM", "WEBHOOK"):
            self.raise_error("Expected FROM WEBHOOK (the only kind of source so far)")
        if not self._match_text_seq("BODY", "FORMAT"):
            self.raise_error("Expected BODY FORMAT")
        format_token = self._advance_any()
        word = format_token.text.upper() if format_token else ""
        if word not in _FORMATS:
            self.raise_error(f"Unsupported BODY FORMAT {word!r}; supported: TEXT, JSON, JSON ARRAY, BYTES")
        body_format = _FORMATS.get(word, "json")
        if body_format == "json" and self._match_text_seq("ARRAY"):
            body_format = "json_array"
        args: dict[str, object] = {"this": name, "body_format": body_format, "if_not_exists": if_not_exists,
                                   "include_headers": False, "headers_allowed": [], "headers_excluded": [],
                                   "header_columns": [], "check_options": []}
        while not self._at_end():
            if self._match_text_seq("INCLUDE", "HEADERS"):
                if args["include_headers"]:
                    self.raise_error("INCLUDE HEADERS given twice")
                args["include_headers"] = True
                if self._match(TokenType.L_PAREN):
                    self._parse_header_filter(args)
            elif self._match_text_seq("INCLUDE", "HEADER"):
                header = self._string_literal("a header name").lower()
                if not self._match(TokenType.ALIAS):
                    self.raise_error("Expected AS <column> after INCLUDE HEADER '<name>'")
                column = self._identifier("a column name")
                args["header_columns"].append((header, column, bool(self._match_text_seq("BYTES"))))  # type: ignore[attr-defined]
            elif self._match_text_seq("CHECK"):
                if args.get("check") is not None:
                    self.raise_error("CHECK given twice")
                self._parse_check(args)
            elif self._match_text_seq("IDEMPOTENT"):
                if args.get("idempotent") is not None:
                    self.raise_error("IDEMPOTENT given twice")
                args["idempotent"] = self._wrapped_expression_text()
                if self._match_text_seq("WINDOW"):
                    args["window"] = self._string_literal("the WINDOW interval, e.g. '24 hours'")
            elif self._match(TokenType.COMMA):
                continue  # INCLUDE clauses may be separated by commas, as in Materialize
            else:
                self.raise_error(f"Unexpected {self._curr.text!r} in CREATE SOURCE")  # type: ignore[union-attr]
                break
        return CreateWebhookSource(**args)

    def _parse_header_filter(self, args: dict[str, object]) -> None:
        while True:
            excluded = self._match(TokenType.NOT)
            header = self._string_literal("a header name").lower()
            target = args["headers_excluded"] if excluded else args["headers_allowed"]
            target.append(header)  # type: ignore[attr-defined]
            if not self._match(TokenType.COMMA):
                break
        self._expect(TokenType.R_PAREN, ")")

    def _parse_check(self, args: dict[str, object]) -> None:
        self._expect(TokenType.L_PAREN, "( after CHECK")
        options: list[tuple[str, str, bool, str | None]] = args["check_options"]  # type: ignore[assignment]
        if self._match(TokenType.WITH):
            self._expect(TokenType.L_PAREN, "( after WITH")
            while True:
                if self._match_text_seq("BODY"):
                    kind, secret, alias = "body", None, "body"
                elif self._match_text_seq("HEADERS"):
                    kind, secret, alias = "headers", None, "headers"
                elif self._match_text_seq("SECRET"):
                    kind, secret = "secret", self._dotted_name("a secret name")
                    alias = secret.rpartition(".")[2]
                else:
                    self.raise_error("Expected BODY, HEADERS or SECRET <name> in CHECK ( WITH (...) )")
                    return
                if self._match(TokenType.ALIAS):
                    alias = self._identifier("an alias")
                options.append((kind, alias, bool(self._match_text_seq("BYTES")), secret))
                if not self._match(TokenType.COMMA):
                    break
            self._expect(TokenType.R_PAREN, ") after the WITH options")
        args["check"] = self._expression_text()
        self._expect(TokenType.R_PAREN, ") to close CHECK")

    # ---- ALTER SOURCE -------------------------------------------------------------------------
    def _parse_alter_source(self) -> AlterSourceWindow:
        if_exists = bool(self._match_text_seq("IF", "EXISTS"))
        name = self._parse_table_parts()
        if not self._match(TokenType.SET):
            self.raise_error("Expected SET (WINDOW = '<interval>')")
        self._expect(TokenType.L_PAREN, "(")
        if not self._match_text_seq("WINDOW"):
            self.raise_error("Expected WINDOW: the only option ALTER SOURCE can set")
        self._match(TokenType.EQ)
        window = self._string_literal("the WINDOW interval, e.g. '24 hours'")
        self._expect(TokenType.R_PAREN, ")")
        return AlterSourceWindow(this=name, window=window, if_exists=if_exists)

    # ---- SECRET -------------------------------------------------------------------------------
    def _parse_secret(self, *, alter: bool) -> CreateSecret:
        if_not_exists = not alter and bool(self._match_text_seq("IF", "NOT", "EXISTS"))
        if_exists = alter and bool(self._match_text_seq("IF", "EXISTS"))
        name = self._parse_table_parts()
        if not self._match(TokenType.ALIAS):
            self.raise_error("Expected AS <value>")
        value = self._expression_text()
        return CreateSecret(this=name, value=value, if_not_exists=if_not_exists, if_exists=if_exists, alter=alter)

    def _parse_drop_secret(self) -> DropObject:
        if_exists = bool(self._match_text_seq("IF", "EXISTS"))
        names = self._parse_csv(self._parse_table_parts)
        cascade = bool(self._match_text_seq("CASCADE"))
        if not cascade:
            self._match_text_seq("RESTRICT")
        return DropObject(kind="secret", expressions=names, if_exists=if_exists, cascade=cascade)
