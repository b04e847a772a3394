"""headrace.log"""
