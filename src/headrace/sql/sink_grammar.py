"""Grammar of connections and sinks, as a sqlglot parser mixin (HeadraceParser inherits it):

    CREATE CONNECTION [IF NOT EXISTS] <name> TO POSTGRES | REDIS (URL [=] SECRET <s> | '<url>')
    CREATE SINK [IF NOT EXISTS] <name> FROM <source | view | table>
        INTO POSTGRES | REDIS | PARQUET | HTTP | EXTERNAL (<option> [=] <value>, ...)
        [WITH (DELTA UPDATES [= true], AT LEAST ONCE [= true])]
    DROP SINK [IF EXISTS] <name> [, ...];  DROP CONNECTION [IF EXISTS] <name> [, ...] [CASCADE | RESTRICT]

An option is one or more words then an optional `=` and a value: a string literal, a number, TRUE / FALSE,
SECRET <name>, a bare name (CONNECTION pg), or a parenthesized list of options (HEADERS ('X-Token' = SECRET t));
a quoted option name keeps its case (header names).
What each driver accepts is checked when the statement executes (sink/options.py), not here.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import TokenType

from headrace.sql.ast import CreateConnection, CreateSink, DropObject, SinkOption
from headrace.sql.source_grammar import WebhookGrammar

CONNECTION_DRIVERS = ("POSTGRES", "REDIS")
SINK_DRIVERS = ("POSTGRES", "REDIS", "PARQUET", "HTTP", "EXTERNAL")


class SinkGrammar(WebhookGrammar):
    def _parse_create_connection(self) -> CreateConnection:
        if_not_exists = bool(self._match_text_seq("IF", "NOT", "EXISTS"))
        name = self._parse_table_parts()
        if not self._match_text_seq("TO"):
            self.raise_error("Expected TO POSTGRES or TO REDIS")
        driver = self._driver_word(CONNECTION_DRIVERS, "a connection")
        options = self._parse_sink_options() if self._match(TokenType.L_PAREN) else []
        return CreateConnection(this=name, driver=driver, options=options, if_not_exists=if_not_exists)

    def _parse_create_sink(self) -> CreateSink:
        if_not_exists = bool(self._match_text_seq("IF", "NOT", "EXISTS"))
        name = self._parse_table_parts()
        if self._match_text_seq("IN", "CLUSTER"):
            self._identifier("a cluster name")  # accepted for Materialize compatibility; one cluster here
        if not self._match(TokenType.FROM):
            self.raise_error("Expected FROM <source, view or table>")
        relation = self._parse_table_parts()
        if not self._match(TokenType.INTO):
            self.raise_error("Expected INTO POSTGRES, REDIS, PARQUET, HTTP or EXTERNAL")
        driver = self._driver_word(SINK_DRIVERS, "a sink")
        options = self._parse_sink_options() if self._match(TokenType.L_PAREN) else []
        with_options: list[SinkOption] = []
        if self._match(TokenType.WITH):
            self._expect(TokenType.L_PAREN, "( after WITH")
            with_options = self._parse_sink_options()
        if not self._at_end():
            self.raise_error(f"Unexpected {self._curr.text!r} in CREATE SINK")  # type: ignore[union-attr]
        return CreateSink(this=name, relation=relation, driver=driver, options=options, with_options=with_options,
                          if_not_exists=if_not_exists)

    def _parse_drop_named(self, kind: str) -> DropObject:
        if_exists = bool(self._match_text_seq("IF", "EXISTS"))
        names = self._parse_csv(self._parse_table_parts)
        cascade = bool(self._match_text_seq("CASCADE"))
        if not cascade:
            self._match_text_seq("RESTRICT")
        return DropObject(kind=kind, expressions=names, if_exists=if_exists, cascade=cascade)

    def _driver_word(self, allowed: tuple[str, ...], what: str) -> str:
        token = self._advance_any()
        word = token.text.upper() if token else ""
        if word not in allowed:
            self.raise_error(f"{word or 'nothing'} is not {what} type; expected one of {', '.join(allowed)}")
        return word

    def _parse_sink_options(self) -> list[SinkOption]:
        """Options up to and including the closing parenthesis (the opening one is matched)."""
        options: list[SinkOption] = []
        if self._match(TokenType.R_PAREN):
            return options
        while True:
            options.append(self._parse_sink_option())
            if self._match(TokenType.R_PAREN):
                return options
            if not self._match(TokenType.COMMA):
                self.raise_error("Expected , or ) between options")
                return options

    def _parse_sink_option(self) -> SinkOption:
        words: list[str] = []
        if self._match(TokenType.STRING):  # a quoted name keeps its case: HEADERS ('X-Api-Key' = ...)
            words.append(self._prev.text)
        while self._curr is not None and self._curr.token_type not in (
                TokenType.EQ, TokenType.STRING, TokenType.NUMBER, TokenType.COMMA, TokenType.R_PAREN,
                TokenType.L_PAREN, TokenType.TRUE, TokenType.FALSE) and not (
                words and self._curr.text.upper() == "SECRET"):
            if words and words[0] == "CONNECTION":
                break  # CONNECTION <name>: the name is the value
            words.append(self._curr.text.upper())
            self._advance()
        if not words:
            self.raise_error("Expected an option name")
        name = " ".join(words)
        self._match(TokenType.EQ)
        if self._match(TokenType.STRING):
            return SinkOption(name=name, kind="string", value=self._prev.text)
        if self._match(TokenType.NUMBER):
            text = self._prev.text
            return SinkOption(name=name, kind="number", value=float(text) if "." in text else int(text))
        if self._match(TokenType.TRUE) or self._match(TokenType.FALSE):
            return SinkOption(name=name, kind="bool", value=self._prev.token_type == TokenType.TRUE)
        if self._match(TokenType.L_PAREN):
            return SinkOption(name=name, kind="list", value=self._parse_sink_options())
        if self._match_text_seq("SECRET"):
            return SinkOption(name=name, kind="secret", value=self._dotted_name("a secret name"))
        if self._curr is not None and self._curr.token_type not in (TokenType.COMMA, TokenType.R_PAREN):
            return SinkOption(name=name, kind="name", value=self._dotted_name(f"a value for {name}"))
        return SinkOption(name=name, kind="bool", value=True)  # a bare flag: WITH (DELTA UPDATES)
