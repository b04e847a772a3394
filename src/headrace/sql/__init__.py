"""headrace.sql"""
