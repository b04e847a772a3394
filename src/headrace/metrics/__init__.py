"""What headrace measures about itself, for GET /metrics and the headrace_internal system relations.

Each part records into plain counters of its own (no Prometheus object on a hot path) and one collector per part
builds the Prometheus families at scrape time, all registered on the HTTP app's registry (http/app.py):

    webhook/metrics.py              headrace_webhook_*           ingest, per source
    pipeline/status.py              headrace_pipeline_*          the pipeline process, its queries and micro-batches
    metrics/materializations.py     headrace_materialization_*   transactions, failures, freshness and lag
    metrics/sessions.py             headrace_pgwire_* / headrace_sql_*  sessions and statement latency
    metrics/store.py                headrace_store_*             the store PostgreSQL: statements, errors, pool
    sink/manager.py (via collect)   headrace_sink_*              sinks

The pipeline runs in a child process. Its micro-batch figures reach the server in the status report it already
sends over its control connection (pipeline/status.py: cumulative since that process started), not through
prometheus_client's multiprocess mode: that mode needs a directory shared by both processes and set before
prometheus_client is imported, leaves files of dead processes to clean up, and would not cover a pipeline driver
reached through Spark Connect; the report is one small message a second while batches run and costs nothing
idle. docs/metrics.md lists every family."""
