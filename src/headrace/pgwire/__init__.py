"""headrace.pgwire"""
