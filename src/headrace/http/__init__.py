"""headrace.http"""
