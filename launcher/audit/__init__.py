"""`sandgate audit`: what the audit logs say (summary, suggested policy, the exit line's denials).

Every log is read through netguard.audit, the one reader; nothing here parses JSON lines itself.
"""
