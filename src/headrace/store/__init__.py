"""headrace.store"""
