"""headrace.materialize.drivers"""
