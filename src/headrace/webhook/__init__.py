"""headrace.webhook"""
