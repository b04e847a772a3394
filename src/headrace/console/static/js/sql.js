// The HTTP SQL API's WebSocket (/api/experimental/sql): one session per socket, requests answered in order, each
// ending with ReadyForQuery, so several can be in flight. The console reads everything through it.

const CREDENTIALS_KEY = "headrace.console.credentials";

export class AuthError extends Error {
  constructor(payload) {
    super(payload.message);
    this.code = payload.code;
  }
}

export function credentials() {
  try {
    return JSON.parse(sessionStorage.getItem(CREDENTIALS_KEY)) || { user: "headrace" };
  } catch {
    return { user: "headrace" };
  }
}

export function setCredentials(value) {
  sessionStorage.setItem(CREDENTIALS_KEY, JSON.stringify(value));
}

export class SqlSocket {
  constructor() {
    this.socket = null;
    this.ready = null;
    this.pending = []; // handlers of the requests sent and not yet answered ReadyForQuery, oldest first
    this.onclose = null;
  }

  connect() {
    if (this.ready) return this.ready;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/api/experimental/sql`);
    this.socket = socket;
    let authenticated = false;
    this.ready = new Promise((resolve, reject) => {
      socket.addEventListener("open", () => {
        const { user, password } = credentials();
        socket.send(JSON.stringify(password ? { user, password } : { user }));
      });
      socket.addEventListener("message", (event) => {
        const message = JSON.parse(event.data);
        if (!authenticated) {
          if (message.type === "Error") reject(new AuthError(message.payload));
          else if (message.type === "ReadyForQuery") { authenticated = true; resolve(this); }
          return;
        }
        this.dispatch(message);
      });
      socket.addEventListener("close", (event) => {
        if (!authenticated) reject(new AuthError({ message: event.reason || "the SQL WebSocket closed", code: "08006" }));
        for (const handlers of this.pending.splice(0)) {
          handlers.error?.({ message: "connection to headrace lost", code: "08006" });
          handlers.done?.();
        }
        this.ready = null;
        this.onclose?.();
      });
    });
    return this.ready;
  }

  dispatch({ type, payload }) {
    const handlers = this.pending[0];
    if (!handlers) return;
    if (type === "ReadyForQuery") {
      this.pending.shift();
      handlers.done?.();
    } else if (type === "Rows") handlers.columns?.(payload.columns);
    else if (type === "Row") handlers.row?.(payload);
    else if (type === "CommandStarting") handlers.starting?.(payload);
    else if (type === "CommandComplete") handlers.complete?.(payload);
    else if (type === "Error") handlers.error?.(payload);
    else if (type === "Notice") handlers.notice?.(payload);
  }

  // Send `sql` (one or more statements); `handlers` get its events as they arrive. Resolves at ReadyForQuery.
  async stream(sql, handlers) {
    await this.connect();
    return new Promise((resolve) => {
      this.pending.push({ ...handlers, done: () => { handlers.done?.(); resolve(); } });
      this.socket.send(JSON.stringify({ query: sql }));
    });
  }

  // The statement's rows as objects by column name, or { error }.
  async query(sql) {
    let columns = [];
    const rows = [];
    let error = null;
    await this.stream(sql, {
      columns: (described) => { columns = described.map((column) => column.name); },
      row: (values) => rows.push(Object.fromEntries(columns.map((name, index) => [name, values[index]]))),
      error: (payload) => { error = payload; },
    });
    return error ? { error, rows: [] } : { rows, columns };
  }

  close() {
    this.socket?.close();
    this.ready = null;
  }
}

// SQLSTATEs that mean "this relation or column is not on this server (yet)": shown as not available.
export function isMissing(error) {
  return !!error && ["42P01", "42703", "42704", "3F000"].includes(error.code);
}

export function quoteIdent(name) {
  return `"${String(name).replaceAll('"', '""')}"`;
}

export function quoteLiteral(value) {
  return `'${String(value).replaceAll("'", "''")}'`;
}
