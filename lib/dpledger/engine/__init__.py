"""dpledger.engine"""
