"""dpledger.audit"""
