// Objects: sources, tables, materialized views, sinks, indexes, secrets (names only) and connections, with their
// SQL and dependencies.

import { h, replace, table, unavailable, errorBox } from "../dom.js";
import { OBJECT_LISTS, OBJECTS, DEPENDENCIES, firstAvailable, viewDefinition, columnsOf } from "../queries.js";

const KINDS = [
  ["source", "Sources"], ["table", "Tables"], ["materialized view", "Materialized views"], ["sink", "Sinks"],
  ["index", "Indexes"], ["secret", "Secrets"], ["connection", "Connections"],
];

export function objectsPage(root, sql) {
  let selected = null;
  const lists = h("div", { class: "objects" });
  const detail = h("section", { class: "detail", id: "object-detail" });
  replace(root, h("h1", {}, "Objects"), h("div", { class: "split" }, lists, detail));

  async function load() {
    const [catalog, dependencies] = await Promise.all([firstAvailable(sql, OBJECTS), firstAvailable(sql, DEPENDENCIES)]);
    const objects = catalog.missing ? await fromShow(sql) : catalog.rows.map(normalizeObject);
    const edges = dependencies.missing ? fallbackEdges(objects) : dependencies.rows.map(normalizeEdge);
    return { objects, edges, dependenciesKnown: !dependencies.missing, fromShow: !!catalog.missing };
  }

  async function refresh() {
    const state = await load();
    const readsOf = (object) => state.edges.filter((edge) => edge.object === object.name).map((edge) => edge.reads);
    const readBy = (object) => state.edges.filter((edge) => edge.reads === object.name).map((edge) => edge.object);
    replace(lists, KINDS.map(([kind, title]) => {
      const rows = state.objects.filter((object) => object.kind === kind);
      return h("section", { class: "kind", "data-kind": kind }, h("h2", {}, `${title} (${rows.length})`),
        table([
          { label: "name", cell: (row) => h("a", { href: "#", class: "object-link", "data-object": row.name,
            onclick: (event) => { event.preventDefault(); selected = row; showDetail(row, state, readsOf, readBy); } }, row.name) },
          { label: state.fromShow ? "type" : "owner", cell: (row) => row.type ?? "" },
          { label: "reads", cell: (row) => readsOf(row).join(", ") },
          { label: "read by", cell: (row) => readBy(row).join(", ") },
        ], rows));
    }), state.dependenciesKnown ? null
      : unavailable("dependencies of materialized views (headrace_internal.object_dependencies)", null));
    if (selected) {
      const again = state.objects.find((object) => object.name === selected.name && object.kind === selected.kind);
      if (!again) replace(detail);
    }
  }

  async function showDetail(object, state, readsOf, readBy) {
    const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
    replace(detail, h("h2", {}, `${object.kind} ${object.name}`), body);
    const parts = [];
    let definition = object.sql;
    if (!definition && object.kind === "materialized view") {
      const shown = await sql.query(viewDefinition(object.name));
      definition = shown.error ? null : shown.rows[0]?.create_sql;
    }
    parts.push(h("h3", {}, "SQL"), definition ? h("pre", { class: "sql" }, definition)
      : object.withheld ? h("p", { class: "muted" }, `not shown: a ${object.kind}'s statement may hold a credential`)
        : unavailable(`the CREATE statement of a ${object.kind}`, null));
    if (["source", "table", "materialized view"].includes(object.kind)) {
      const columns = await sql.query(columnsOf(object.name));
      parts.push(h("h3", {}, "Columns"), columns.error ? errorBox(columns.error)
        : table(["column_name", "data_type", "is_nullable"], columns.rows));
    }
    parts.push(h("h3", {}, "Reads"), h("p", {}, readsOf(object).join(", ") || "nothing"),
      h("h3", {}, "Read by"), h("p", {}, readBy(object).join(", ") || "nothing"));
    replace(body, parts);
  }

  return { refresh, interval: 10000 };
}

// A row of headrace_internal.objects. `definition` is NULL for sinks, connections and secrets (their statements may
// hold a credential).
function normalizeObject(row) {
  return { name: row.name, kind: row.kind, type: row.owner ?? "", sql: row.definition,
    schema: row.schema, withheld: ["sink", "connection", "secret"].includes(row.kind) };
}

// A row of headrace_internal.object_dependencies: the object, and an object it reads.
function normalizeEdge(row) {
  return { object: unqualified(row.name), reads: unqualified(row.referenced_name) };
}

// Objects live in schema public: "public.v" and "v" name the same one.
function unqualified(name) {
  return typeof name === "string" && name.startsWith("public.") ? name.slice("public.".length) : name;
}

// What SHOW and pg_catalog say, on a server without headrace_internal.objects.
async function fromShow(sql) {
  const names = Object.keys(OBJECT_LISTS);
  const results = await Promise.all(names.map((name) => sql.query(OBJECT_LISTS[name])));
  const by = Object.fromEntries(names.map((name, index) => [name, results[index].rows || []]));
  const sources = new Set(by.sources.map((row) => row.name));
  return [
    ...by.sources.map((row) => ({ name: row.name, kind: "source", type: row.type })),
    ...by.relations.filter((row) => !sources.has(row.name)).map((row) => ({ name: row.name, kind: "table", type: "table" })),
    ...by.views.map((row) => ({ name: row.name, kind: "materialized view", type: "materialized view" })),
    ...by.sinks.map((row) => ({ name: row.name, kind: "sink", type: row.type, reads: row.relation, state: row.state })),
    ...by.indexes.map((row) => ({ name: row.name, kind: "index", type: `on ${row.on} ${row.key}`, reads: row.on })),
    ...by.secrets.map((row) => ({ name: row.name, kind: "secret", type: "secret" })),
    ...by.connections.map((row) => ({ name: row.name, kind: "connection", type: row.type })),
  ];
}

// Without the dependency relation: what SHOW says (a sink's relation, an index's relation).
function fallbackEdges(objects) {
  return objects.filter((object) => object.reads).map((object) => ({ object: object.name, reads: unqualified(object.reads) }));
}
