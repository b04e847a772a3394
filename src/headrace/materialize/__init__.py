"""headrace.materialize"""
