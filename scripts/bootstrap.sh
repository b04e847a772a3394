#!/usr/bin/env bash
# Installs what headrace needs on a fresh Debian machine: a JDK for Spark (if none is found), PostgreSQL 15 (the
# store server), a Python >= 3.11 virtual environment in .venv with headrace and its pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  need_apt+=(openjdk-17-jre-headless)
fi
# javac and Debian's pgjdbc: tests/e2e/test_clients_jdbc.py compiles and runs a JDBC session.
if ! command -v javac >/dev/null 2>&1; then
  need_apt+=(openjdk-17-jdk-headless)
fi
if [ ! -e /usr/share/java/postgresql.jar ]; then
  need_apt+=(libpostgresql-jdbc-java)
fi
if ! command -v psql >/dev/null 2>&1 || ! command -v pgbench >/dev/null 2>&1; then
  need_apt+=(postgresql-client)  # psql, and pgbench for tests/e2e/test_pgbench.py
fi
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  # the embedded store PostgreSQL of `headrace up` (docs/store.md; it also creates the `postgres` account the store
  # runs as under root), real PostgreSQL 15 servers in tests (tests/real_servers) and the compat harness
  need_apt+=(postgresql-15)
fi
if ! command -v redis-server >/dev/null 2>&1; then
  need_apt+=(redis-server)  # tests/materialize/drivers: the REDIS sink driver against a real server
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  need_apt+=(chromium chromium-driver)  # tests/console: the web console driven in headless Chromium (selenium)
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need_apt[*]} with apt-get"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"headrace needs Python >= 3.11, found {sys.version.split()[0]}")
PY

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "bootstrap: ready ($(java -version 2>&1 | head -n1); $(.venv/bin/python --version))"
